"""What one block's autograd graph really keeps for backward, on any device: the truth the memory
estimate's per-block count (buildllm/memory/estimate.py) is checked against."""

from __future__ import annotations

import torch

from buildllm.model.gpt import GPTConfig, build_model


def saved_bytes_of_one_block(
    config: GPTConfig, autocast_dtype: torch.dtype | None, batch: int = 4, device: str = "cpu", attention: str = "sdpa"
) -> int:
    """Bytes of the distinct storages one block's autograd graph keeps, weights excluded."""
    model = build_model(config, device)
    model.attention = attention
    block, T = model.blocks[0], config.sequence_length
    rope = None if config.architecture == "classic" else (model.rope_cos[:T], model.rope_sin[:T])
    x = torch.randn(batch, T, config.n_embd, device=device, requires_grad=True)
    kind = torch.device(device).type
    context = torch.autocast(kind, dtype=autocast_dtype) if autocast_dtype else torch.autocast(kind, enabled=False)
    with context:
        out = block(x, rope)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages, stack, visited = {}, [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for name in dir(node):
            value = getattr(node, name) if name.startswith("_saved_") else None
            for tensor in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(tensor, torch.Tensor):
                    storage = tensor.untyped_storage()
                    if storage.data_ptr() not in weights:
                        storages[storage.data_ptr()] = storage.nbytes()
        stack.extend(next_node for next_node, _ in node.next_functions)
    # Autocast's weight copies are counted apart (autocast_weights); the rotary tables are tiny.
    cast_weights = sum(p.numel() for p in block.parameters() if p.dim() >= 2) * 2 if autocast_dtype else 0
    return sum(storages.values()) - cast_weights
