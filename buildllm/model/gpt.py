"""A small GPT in two architectures.

classic: GPT-2 (LayerNorm, learned positions, GELU MLP, biases).
modern:  RMSNorm, rotary positions (RoPE), SwiGLU MLP, no biases.
Both compute attention with torch's scaled_dot_product_attention, whose dispatch picks a kernel for
the device, or written out (explicit_attention) where the run plan measured that faster
(plan/attention.py): the same function either way, so checkpoints do not depend on it.
Three knobs change either one (GPTConfig; docs/pipeline.md, "Architecture knobs"): the MLP's
activation (GELU, ReLU squared, SwiGLU), RMS-normalised queries and keys, zero-initialised residual
projections.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from buildllm.device.rng import seed_all
from buildllm.model.fused_loss import linear_cross_entropy
from buildllm.shape import ACTIVATIONS, GPTConfig


def norm_layer(config: GPTConfig) -> nn.Module:
    if config.architecture == "classic":
        return nn.LayerNorm(config.n_embd, bias=config.bias)
    return nn.RMSNorm(config.n_embd, eps=1e-6)


def rotary_tables(config: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """On the default device. Computed on the CPU first: the tables are small, and on a meta model the
    same ops would run torch's Python reference ops (see _NoInitialisation)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_base ** (torch.arange(0, half, device="cpu", dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(config.sequence_length, device="cpu", dtype=torch.float32), inv_freq)
    device = torch.get_default_device()
    return angles.cos().to(device), angles.sin().to(device)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, H, T, D); rotate the two halves of each head as complex pairs.
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def explicit_attention(q, k, v, dropout_p: float = 0.0) -> torch.Tensor:
    """Causal attention as a learner writes it: scores, the mask, softmax, the weighted values. It holds
    a (batch x heads x tokens x tokens) tensor that flash attention never builds, and can still be the
    faster one: which one is, is measured (plan/attention.py)."""
    T = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    weights = scores.masked_fill(future, float("-inf")).softmax(-1)
    return F.dropout(weights, dropout_p) @ v if dropout_p else weights @ v


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        # The run plan's attention decision (RunPlan.attention, set by the Trainer through GPT.attention).
        self.explicit = False
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.proj.residual_projection = True

    def forward(self, x, rope=None, cache=None):
        B, T, C = x.shape
        H = self.config.n_head
        # split, not a (3, B, H, T, D) view unbound: unbind's backward stacks the three gradients into
        # a new tensor and copies it again into the qkv layout; split's writes them into one buffer.
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        if self.config.qk_norm:
            # Unit-RMS queries and keys bound the attention logits whatever the q/k weights grow to,
            # which lets a high learning rate stay stable. Before rotary, which only rotates pairs.
            # The cast: autocast may run a norm in fp32, and attention needs q, k, v in one dtype.
            q, k = (F.rms_norm(t, (C // H,), eps=1e-6).to(v.dtype) for t in (q, k))
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if cache is not None:
            k, v = cache.append(k, v)
        # A single new token attends to everything cached; a prompt attends causally.
        causal = T > 1
        if causal and k.shape[2] != T:
            raise ValueError("prefill with a non-empty KV cache is not supported; start a new cache")
        dropout = self.config.dropout if self.training else 0.0
        if self.explicit and causal:
            y = explicit_attention(q, k, v, dropout)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def activate(activation: str, up: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
    """The MLP's activation (shape.py ACTIVATIONS) of its up projection, and of its gate for swiglu."""
    if activation == "swiglu":
        return F.silu(gate) * up
    if activation == "relu2":
        # r * r, not r.square(): autocast runs pow in fp32 on CUDA, an extra cast and fp32 copy.
        r = F.relu(up)
        return r * r
    return F.gelu(up, approximate="tanh" if activation == "gelu_tanh" else "none")


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.activation = config.mlp_activation
        hidden = config.mlp_hidden
        self.up = nn.Linear(config.n_embd, hidden, bias=config.bias)
        if config.gated:
            self.gate = nn.Linear(config.n_embd, hidden, bias=False)
        self.down = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.down.residual_projection = True

    def forward(self, x):
        gate = self.gate(x) if self.activation == "swiglu" else None
        return self.down(activate(self.activation, self.up(x), gate))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = norm_layer(config)
        self.attn = CausalSelfAttention(config)
        self.norm2 = norm_layer(config)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, rope=None, cache=None):
        x = x + self.dropout(self.attn(self.norm1(x), rope, cache))
        return x + self.dropout(self.mlp(self.norm2(x)))


class KVCache:
    """Keys and values of the tokens generated so far, one pair per layer; a forward pass appends to
    each layer in turn."""

    def __init__(self, n_layer: int):
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layer
        self.length = 0  # tokens cached in every layer
        self._layer = 0

    def append(self, k, v):
        previous = self.layers[self._layer]
        if previous is not None:
            k, v = torch.cat((previous[0], k), dim=2), torch.cat((previous[1], v), dim=2)
        self.layers[self._layer] = (k, v)
        self._layer = (self._layer + 1) % len(self.layers)
        if self._layer == 0:
            self.length = k.shape[2]
        return k, v


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd {config.n_embd} is not divisible by n_head {config.n_head}")
        if config.mlp_activation not in ACTIVATIONS:
            raise ValueError(f"activation {config.mlp_activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.config = config
        self.gradient_checkpointing = False
        # Rows of the fused output layer + cross-entropy computed at once: the run plan's decision
        # (RunPlan.loss, set by the Trainer). None: every row at once, as the plain loss does.
        self.loss_chunk_rows: int | None = None
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        if config.architecture == "classic":
            self.position_embedding = nn.Embedding(config.sequence_length, config.n_embd)
        else:
            cos, sin = rotary_tables(config)
            # Not persistent: recomputed on build, so checkpoints hold only learned weights.
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.final_norm = norm_layer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tied_output:  # one matrix for both ends: fewer parameters (docs/pipeline.md, Profiles)
            self.lm_head.weight = self.token_embedding.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            residual = getattr(module, "residual_projection", False)
            if residual and self.config.zero_init_projections:
                # Every block starts as the identity: the residual stream is the embeddings at step 0,
                # free of the blocks' random writes, and each block learns in from there.
                nn.init.zeros_(module.weight)
            else:
                # GPT-2: scale residual writes so the residual stream's variance doesn't grow with depth.
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if residual else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def attention(self) -> str:
        return "explicit" if self.blocks[0].attn.explicit else "sdpa"

    @attention.setter
    def attention(self, kernel: str) -> None:
        """Either "sdpa" or "explicit": the run plan's decision (RunPlan.attention)."""
        if kernel not in ("sdpa", "explicit"):
            raise ValueError(f"attention {kernel!r} is neither 'sdpa' nor 'explicit'")
        for block in self.blocks:
            block.attn.explicit = kernel == "explicit"

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        return_logits: bool = False,
    ):
        """(logits, loss). With targets the loss comes from the fused output layer + cross-entropy and
        the logits are None, never materialised, unless return_logits asks for them (the plain path)."""
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.config.sequence_length:
            raise ValueError(f"sequence of {start + T} tokens exceeds the model's {self.config.sequence_length}")
        x = self.token_embedding(idx)
        rope = None
        if self.config.architecture == "classic":
            x = x + self.position_embedding(torch.arange(start, start + T, device=idx.device))
        else:
            rope = (self.rope_cos[start : start + T], self.rope_sin[start : start + T])
        x = self.dropout(x)
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope, cache)
        x = self.final_norm(x)
        if targets is None:
            return self.lm_head(x[:, -1:, :]), None
        if not return_logits:
            return None, linear_cross_entropy(
                x.reshape(B * T, -1), self.lm_head.weight, targets.reshape(-1), self.loss_chunk_rows or B * T
            )
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def build_model(config: GPTConfig, device: str | torch.device = "cpu", seed: int | None = None) -> GPT:
    """Build on `device`; device="meta" counts parameters and plans memory without allocating. A
    seed seeds every generator first (device/rng.py): the same initial weights in every process and
    run, and the same random draws after them."""
    if seed is not None:
        seed_all(seed)
    initialisation = _NoInitialisation() if torch.device(device).type == "meta" else contextlib.nullcontext()
    with torch.device(device), initialisation:
        return GPT(config)


class _NoInitialisation(TorchFunctionMode):
    """Skips torch.nn.init's in-place initialisers on meta tensors, which hold no values to set.
    Initialising them anyway runs torch's Python reference ops, whose first call imports
    torch._dynamo: about 2 s that a dry run or an estimate would pay only to count parameters."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" and func.__name__.endswith("_"):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)
