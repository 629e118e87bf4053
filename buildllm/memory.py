"""Training memory, estimated from the model's shape before anything is allocated.

Peak memory of one training step = weights + gradients + AdamW state (all fp32)
  + autocast's low-precision weight copies
  + activations saved for backward (per layer, per token, from the block's saved tensors)
  + logits and their gradient (batch x sequence x vocab, the largest single tensors of a small GPT)
  + one layer's attention scores where the attention kernel materialises them.
The benchmark measures the real peak beside this estimate, so the two can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from buildllm.model import GPTConfig

FP32 = 4


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    autocast_weights: int
    activations: int
    logits: int
    attention_scores: int

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.autocast_weights
                + self.activations + self.logits + self.attention_scores)

    def as_metrics(self, prefix: str = "memory_estimate_") -> dict:
        parts = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return {f"{prefix}{name}_bytes": value for name, value in {**parts, "total": self.total}.items()}


def saved_floats_per_token_per_layer(model: GPTConfig) -> tuple[int, int]:
    """(fp32 floats, compute-dtype floats) one block saves per token for its backward pass."""
    d, hidden = model.n_embd, model.mlp_hidden
    # Residual stream inputs to the two norms stay fp32 under autocast.
    fp32 = 2 * d
    # norm outputs (2d), q/k/v (3d), attention output (d), MLP input of down-projection and its pre-activation.
    mlp = 2 * hidden if model.architecture == "classic" else 4 * hidden  # SwiGLU: gate, up, silu(gate), product
    low = 2 * d + 3 * d + d + mlp
    if model.architecture == "modern":
        low += 2 * d  # rotated copies of q and k
    return fp32, low


def attention_scores_materialised(device_kind: str, dropout: float) -> bool:
    # Flash and memory-efficient kernels (CUDA, CPU) never store the T x T matrix; the math path
    # used on MPS, and with attention dropout, does.
    return device_kind in ("mps", "xla") or dropout > 0


def estimate_training_memory(model: GPTConfig, parameters: int, batch_size: int, precision_bytes: int,
                             device_kind: str, gradient_checkpointing: bool = False) -> MemoryEstimate:
    tokens = batch_size * model.sequence_length
    fp32_floats, low_floats = saved_floats_per_token_per_layer(model)
    per_layer = tokens * (fp32_floats * FP32 + low_floats * precision_bytes)
    if gradient_checkpointing:
        # Only each block's input is kept; one block's activations are rebuilt at a time in backward.
        activations = model.n_layer * tokens * model.n_embd * FP32 + per_layer
    else:
        activations = model.n_layer * per_layer
    # Logits in the compute dtype, their fp32 copy for the loss, its softmax, and the gradient.
    logits_per_element = precision_bytes + 3 * FP32 if precision_bytes != FP32 else 3 * FP32
    logits = tokens * model.vocab_size * logits_per_element
    scores = 0
    if attention_scores_materialised(device_kind, model.dropout):
        scores = 2 * batch_size * model.n_head * model.sequence_length ** 2 * precision_bytes
    autocast_weights = parameters * precision_bytes if precision_bytes != FP32 else 0
    return MemoryEstimate(
        weights=parameters * FP32,
        gradients=parameters * FP32,
        optimizer=2 * parameters * FP32,
        autocast_weights=autocast_weights,
        activations=activations,
        logits=logits,
        attention_scores=scores,
    )


def checkpoint_bytes(parameters: int) -> int:
    """Weights plus AdamW's two moments, all fp32; config, RNG and cursor add a few kilobytes."""
    return 3 * parameters * FP32
