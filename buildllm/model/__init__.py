"""The model: the GPT itself, its shape (shape.py, torch-free), the fused loss, and its FLOPs."""
