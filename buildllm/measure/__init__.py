"""Measurement, by running the train step: the benchmark, the batch-size finder, sweeps, `buildllm
tune`, and the statistics that say how far a figure can be trusted (stats.py)."""
