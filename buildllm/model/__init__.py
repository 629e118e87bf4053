"""The model: the GPT itself, the fused loss, and its FLOPs (its shape, torch-free: buildllm/shape.py)."""
