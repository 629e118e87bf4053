"""Training: the Trainer and its loop, checkpoints, schedule, optimizer, processes, run log, sampling."""
