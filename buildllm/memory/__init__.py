"""The memory model: a run's peak memory from its shape (estimate.py). Below the plan, so make_plan
can decide with it (whether a plan fits, and the largest batch that does: buildllm/plan/memory.py);
the commands built on it (dry run, `buildllm fits`, preflight) live in buildllm/predict/."""
