"""Measurement, by running the train step: the benchmark, the batch-size finder, sweeps, the step's
time breakdown and the noise statistics that say how far a figure can be trusted."""
