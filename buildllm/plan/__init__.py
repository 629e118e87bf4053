"""The decision layer: every automatic choice a run makes (device, precision, batch and other
defaults, threads, compile, the loss's chunks, fused AdamW, whether the memory fits), one module per
decision, each with its value and its reason. run_plan.py puts them together: make_plan(config) ->
RunPlan, the one object train, benchmark, the dry run, tune and the reports read. Nothing below the
plan decides again.
"""
