"""Prediction, before anything trains: the dry run, the memory estimate, the largest batch that fits,
the run's time from a benchmark (estimate), and the preflight checks built on them."""
