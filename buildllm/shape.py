"""A model's shape as plain numbers: what a profile names and the config overrides (no torch here,
so the profiles and the config can speak of shapes without importing it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Each architecture's own MLP activation: what `activation: None` means.
OWN_ACTIVATION = {"classic": "gelu", "modern": "swiglu"}
# gelu: the exact GELU (erf), torch's default and nanoGPT's; gelu_tanh: GPT-2's tanh approximation of it,
# what `gelu` meant until 2026-12-07 (a checkpoint saved before reads as gelu_tanh: train/checkpoint.py).
# On a 2-core AMD EPYC Zen 3 (AVX2) torch's tanh form took 2.2x the exact form's time forward and
# backward at iteration 1's MLP (5.6 against 2.5 ms), and the whole classic fp32 step 1.034x the time
# at iteration 1 (10 interleaved pairs), 1.043x at tiny (6), 1.00x at small (6), where matmuls dominate.
# relu2: relu(x)**2 (Primer; the modded-nanogpt speedrun's MLP); swiglu: silu(gate) * up, a third matrix.
ACTIVATIONS = ("gelu", "gelu_tanh", "relu2", "swiglu")


@dataclass(frozen=True)
class GPTConfig:
    architecture: str = "classic"
    vocab_size: int = 4096
    sequence_length: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    rope_base: float = 10000.0
    # The output layer shares the token embedding's matrix (profiles/__init__.py says which profile
    # and architecture keep their own). A checkpoint saved before this field existed was tied.
    tied_output: bool = True
    # The architecture knobs docs/pipeline.md describes ("Architecture knobs"); a checkpoint saved before
    # they existed had each one's default. activation None: the architecture's own (OWN_ACTIVATION).
    activation: str | None = None
    qk_norm: bool = False  # RMS-normalise each head's queries and keys (no learned gain) before attention
    zero_init_projections: bool = False  # the residual projections start at zero, not GPT-2's scaled normal

    def __post_init__(self):
        # One spelling per model: naming the architecture's own activation is the default, so the same
        # model has the same checkpoint signature however it was asked for.
        if self.activation == OWN_ACTIVATION.get(self.architecture):
            object.__setattr__(self, "activation", None)

    @property
    def mlp_activation(self) -> str:
        return self.activation or OWN_ACTIVATION[self.architecture]

    @property
    def gated(self) -> bool:
        return self.mlp_activation == "swiglu"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def bias(self) -> bool:
        return self.architecture == "classic"

    @property
    def mlp_hidden(self) -> int:
        if not self.gated:
            return 4 * self.n_embd
        # SwiGLU has three matrices instead of two: 2/3 of 4d keeps the parameter count of a 4d MLP.
        return 64 * math.ceil(8 * self.n_embd / 3 / 64)
