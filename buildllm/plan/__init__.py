"""The decision layer: every automatic choice a run makes, made once, before anything is built, each
with its value and its reason. One module per decision:

- device.py: which device (auto: cuda, then mps, then cpu) or why a requested one is refused
- precision.py: fp32, bf16 or fp16, from the request, the profile, the device and this machine's figures
- defaults.py: batch size, data-loader workers and learning rate: requested, or the profile's default
- threads.py: torch's thread count (measured here, or torch's default)
- compile.py: torch.compile, where measured gains pay back the compile time
- loss_chunk.py: how many rows the fused output layer + loss computes at once
- fused_adamw.py: fused AdamW where it builds on the device, the standard AdamW otherwise
- memory.py: whether the estimated peak fits the memory free now, and the largest batch that does
- tuned.py: this machine's tune figures (metrics/tune.json) that the measured rules read

run_plan.py puts them together: make_plan(config) -> RunPlan, the one object train, benchmark, the
dry run, tune and the reports read. Nothing below the plan decides again.
"""
