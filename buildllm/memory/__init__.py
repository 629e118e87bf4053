"""The memory model, a prediction the plan itself needs: a run's peak memory from its shape
(estimate.py), the largest batch that fits a size, and whether a plan fits the memory free now
(fit.py). Below the plan, so make_plan can decide with it; the commands built on it (dry run,
`buildllm fits`, preflight) live in buildllm/predict/."""
