"""Prediction, before anything trains: the dry run, the run's time, what fits, the preflight checks."""
