"""A model's shape as plain numbers: what a profile names and the config overrides (no torch here,
so the profiles and the config can speak of shapes without importing it)."""

from __future__ import annotations

import math
from dataclasses import dataclass


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

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def bias(self) -> bool:
        return self.architecture == "classic"

    @property
    def mlp_hidden(self) -> int:
        if self.architecture == "classic":
            return 4 * self.n_embd
        # SwiGLU has three matrices instead of two: 2/3 of 4d keeps the parameter count of a 4d MLP.
        return 64 * math.ceil(8 * self.n_embd / 3 / 64)
