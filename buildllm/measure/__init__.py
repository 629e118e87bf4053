"""Measurement, by running the train step: the benchmark, the batch-size finder, sweeps, the step's
time breakdown, the statistics that say how far a figure can be trusted (stats.py: noise, paired
ratios, intervals), and `buildllm tune` (tune.py, with its compile child in tune_compile.py), which
measures the plan's auto decisions on this machine."""
