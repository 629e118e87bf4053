"""The device: what this machine's torch can reach, what a device and each precision imply
(synchronisation, memory, peak FLOP/s, autocast, hardware). The only package that asks what kind a
device is; which device and precision a run uses is decided in buildllm/plan/."""
