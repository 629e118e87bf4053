"""Training memory, estimated from the model's shape before anything is allocated.

A training step's memory peaks at one of two moments, and the estimate takes the larger:
  1. the start of backward: weights + optimizer state + activations saved for backward + the logits'
     cross-entropy tensors (+ autocast's low-precision weight copies). No gradient exists yet:
     the Trainer frees them after every step (zero_grad(set_to_none=True)). The logits term is
     one chunk of the fused output layer + cross-entropy and the weight gradient it keeps.
  2. the optimizer step: weights + optimizer state + gradients. Activations are gone, and no logits
     are held (the fused loss never materialises them).
On host memory, a run that saves a checkpoint before its last step holds one more copy of the
weights and optimizer state at either moment: the first save makes a host copy of them, written in
the background while the next steps run, and the run keeps it for every later save to write into
(train/background_save.py). A GPU's copy is in host memory, not the device's.
Small models peak at 1 (logits and activations scale with batch x sequence); a large model at a
small batch can peak at 2. With gradient accumulation, gradients also exist at moment 1.

On the CPU the measured growth of resident memory is more than the tensors alive at the peak: glibc
keeps freed blocks for reuse, and the first steps touch runtime memory (thread pools, kernel code,
oneDNN caches); both are modelled from measurements (`buildllm verify memory`). On CUDA the estimate
predicts the *allocated* peak: the *reserved* one is larger by the allocator's cached free blocks,
which no shape formula predicts. The stated range (low, high) covers what the model cannot pin down.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from buildllm.device.device import Device
from buildllm.model.fused_loss import chunk_bytes_per_row
from buildllm.shape import GPTConfig

FP32 = 4
MiB = 2**20
# CPU only (Linux, glibc), measured (`buildllm verify memory --full`) on tiny ... gpt_100m at batch sizes
# 1 to 128, fp32 and bf16. With glibc's mmap threshold pinned (MALLOC_MMAP_THRESHOLD_=131072), the
# resident growth was the live tensors plus 13-24 MiB whatever the shape: the runtime's first use.
CPU_RUNTIME_BYTES = 20 * MiB
# bf16 autocast on the CPU took about 12 MiB more (its own kernels; seen at small shapes).
CPU_LOW_PRECISION_RUNTIME_BYTES = 12 * MiB
# What glibc's heap holds beyond the live tensors: blocks a step freed where no later allocation of the
# step fitted. A training process keeps every freed block (device/allocator.py), so the heap's
# high-water mark is the resident peak, and the holes grow with the tensors a step frees: its
# activations (the weights and optimizer state are made once and never freed). Fitted on the fitted
# fp32 shapes of `buildllm verify memory --full` with the thresholds raised (29 shapes, 2 fresh
# processes each; 2026-12-07, 2-core AMD EPYC, family 25 model 1): 0.32 of the activations, the
# least-squares fit of the log ratio. It was 0.12 of the live tensors, fitted before the thresholds
# were raised and while student was classic: student modern fp32 b64 then read 0.82 of its peak,
# and one process under load crossed the +25% edge.
CPU_FREED_ACTIVATIONS_SHARE = 0.32
# CPU, in fp32 and under autocast, fitted as remade_after_backward says: with gradient checkpointing the
# rebuilt blocks' memory glibc keeps, in widths (n_embd-sized vectors) per token and layer; with gradient
# accumulation the share of one micro-batch's activations the second micro-batch allocates anew.
CPU_CHECKPOINT_RETAINED_WIDTHS = 10
CPU_CHECKPOINT_RETAINED_WIDTHS_AUTOCAST = 7
CPU_ACCUMULATION_REMADE = 0.4
CPU_ACCUMULATION_REMADE_AUTOCAST = 0.18
# torch.compile on the CPU: what a compiled step holds that an eager one does not. With glibc's mmap
# threshold pinned (every freed tensor returned, so the growth is live memory) compiled tiny b32 and
# gpt_first_cpu b16 grew by 70.6 and 71.6 MiB more than eager: inductor's generated code, loaded
# kernels and their runtime, the same for both shapes (activations alike: AOT autograd saved no more).
CPU_COMPILED_RUNTIME_BYTES = 72 * MiB
# How far the measured peak may lie from the estimate, stated as its range (memory_estimate_low/high):
# (fraction below, fraction above) the total.
# CPU: glibc's retained blocks are not a fixed share of the live tensors, and they vary from run to
# run: the same shape (gpt_first_cpu, batch 24, gradient checkpointing, fp32) measured 290, 312,
# 327, 328 and 348 MiB in five fresh processes (estimate 289). Over the fitted and the held-out
# shapes of `buildllm verify memory --full` the measured peak was 0.90-1.21 x the estimate, the high side
# on fp32 shapes unlike the fitted ones (accumulation, checkpointing, other sequence lengths):
# stated as -15% / +25%. With CPU_FREED_ACTIVATIONS_SHARE (2026-12-07, fp32 only: that CPU refuses
# bf16) the median peak of 2 processes was 0.88-1.14 x the estimate on the 29 fitted shapes and
# 0.88-1.12 x on the 18 held-out ones; one single run of 94 fell under the range (0.85 x: held-out
# gpt_first_cpu b32 checkpointed at sequence 96). The bf16 shapes' estimates moved by -8% to +5% with
# it and are not measured again yet: they need a CPU with a bf16 path.
# CUDA: the allocated peak is the live tensors plus the kernels' workspaces (cuBLAS, attention)
# and the allocator's 512-byte rounding: ±15% is stated, which the truth script checks there.
# MPS and XLA: the driver's figures are not modelled beyond the tensors.
SPREAD = {"cpu": (0.15, 0.25), "cuda": (0.15, 0.15)}
OTHER_DEVICE_SPREAD = (0.25, 0.25)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each kind alive at the peak moment (a part not alive then is 0); they sum to the total."""

    weights: int
    gradients: int
    optimizer: int
    autocast_weights: int
    activations: int
    logits: int
    attention_scores: int
    allocator: int  # CPU: freed blocks the allocator keeps, plus the runtime's own first-use memory
    # What the step's kernels hold beside the tensors: CUDA's cuBLAS workspaces; on the CPU, what a
    # torch.compile'd step keeps that an eager one does not (its generated code and runtime).
    workspace: int = 0
    # Host memory: the checkpoint's host copy, made at the first mid-run save and kept for the run.
    checkpoint_copy: int = 0
    # The stated range: the measured peak lies within total x (1 - spread[0], 1 + spread[1]).
    spread: tuple[float, float] = (0.0, 0.0)

    @property
    def parts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "spread"}

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def low(self) -> int:
        return int(self.total * (1 - self.spread[0]))

    @property
    def high(self) -> int:
        return int(self.total * (1 + self.spread[1]))

    @property
    def peak_moment(self) -> str:
        return "optimizer step" if self.activations == 0 else "start of backward"

    def as_metrics(self) -> dict:
        named = {**self.parts, "total": self.total}
        return {f"memory_estimate_{name}_bytes": value for name, value in named.items()} | self.range_metrics()

    def range_metrics(self) -> dict:
        return {"memory_estimate_low_bytes": self.low, "memory_estimate_high_bytes": self.high}


def saved_floats_per_token_per_layer(
    model: GPTConfig, autocast: bool = False, cuda_kernels: bool = False
) -> tuple[int, int]:
    """(fp32 floats, compute-dtype floats) one block saves per token for its backward pass.

    Read off the autograd graph's saved tensors, each storage once (tests/measure/test_benchmark_memory.py
    checks it for both architectures, each MLP activation and qk-norm, in fp32 and under bf16
    autocast, on the CPU; test_cuda.py's saved-tensor check on CUDA). cuda_kernels: CUDA's own
    kernels, where they save less (below). Per-token statistics (norms' rstd, attention's log-sum-exp)
    are left out: under 2%.
    """
    d, hidden = model.n_embd, model.mlp_hidden
    if model.architecture == "classic":
        fp32 = 2 * d  # LayerNorm keeps its fp32 input (the residual stream), twice
    elif cuda_kernels:
        # CUDA's RMSNorm is one fused kernel that saves its input and the per-token rstd only. On the
        # H200 (2026-12-04, student modern fp32 batch 64) the CPU's counts read 72 MiB over the
        # measured peak: 48 MiB of norm outputs and 24 of copies (the attention output's, below).
        fp32 = 2 * d + 2
    else:
        fp32 = 4 * d  # RMSNorm keeps its input and the normalised input, twice
    # The matmuls after the norms keep their inputs: qkv's, and the MLP's once in fp32 but once per
    # call under autocast, which casts per call (twice for a gated MLP's gate and up).
    low = d + (2 * d if autocast and model.gated else d)
    # q/k/v are views of one qkv tensor (3d) that the attention kernel keeps. Rotary positions or
    # qk-norm make new q and k, which the kernel keeps instead of the views (2d; with both, rotary's).
    fresh = model.architecture == "modern" or model.qk_norm
    low += 3 * d + (2 * d if fresh else 0)
    # The attention output (d). The CPU's kernel, and CUDA's flash (under autocast), lay it out like q:
    # in (batch, head, token) order when q is a new tensor, so the transpose-reshape before proj is a
    # copy (another d; the H200 read 4.6% over the count without it for modern in bf16). With q a
    # view of qkv, and CUDA's memory-efficient kernel (fp32) always, (batch, token, head): a view.
    low += 2 * d if fresh and (autocast or not cuda_kernels) else d
    if model.qk_norm and autocast and not cuda_kernels:
        fp32 += 2 * d  # the CPU's rms_norm computes in fp32 and keeps that copy of q and k
    # GELU keeps its input and output, ReLU squared relu(x) and its square (2 hidden); SwiGLU keeps
    # gate, up, silu(gate) and their product (4 hidden).
    low += (4 if model.gated else 2) * hidden
    return fp32, low


# cuBLAS's workspace per (handle, stream), which PyTorch allocates through its caching allocator, so
# max_memory_allocated counts it. PyTorch's default when CUBLAS_WORKSPACE_CONFIG is unset
# (aten/src/ATen/cuda/CublasHandlePool.cpp): ":4096:8" on Hopper (compute capability 9.x), 8 chunks of
# 4096 KiB = 32 MiB; ":4096:2:16:8" elsewhere, 2 x 4096 KiB + 8 x 16 KiB = 8.125 MiB.
HOPPER_CUBLAS_WORKSPACE = ":4096:8"
OTHER_CUBLAS_WORKSPACE = ":4096:2:16:8"
# Handles are per thread and device, workspaces per handle and stream: a training step's forward runs
# on the Python thread, its backward on the autograd engine's thread for that device, each with its
# own handle, both on the current stream: two workspaces. Counted as a fresh process sees them: a
# pipeline run makes them during its steps, so its measured peak holds them (five runs on an H200,
# 2026-12-04: estimate within 0.978-0.988 of the peak); a process that used cuBLAS before has them
# in its baseline instead (a test measuring in such a process read 1.157).
CUBLAS_WORKSPACES_PER_STEP = 2


def cublas_workspace_bytes(config: str) -> int:
    """Bytes of one workspace for a CUBLAS_WORKSPACE_CONFIG value (":SIZE_KIB:COUNT" pairs, summed)."""
    numbers = [int(n) for n in config.split(":") if n.strip()]
    return sum(size * 1024 * count for size, count in zip(numbers[::2], numbers[1::2]))


def cuda_workspace_bytes(device: Device) -> int:
    """CUDA: the step's cuBLAS workspaces (CUBLAS_WORKSPACE_CONFIG, else PyTorch's default for this GPU)."""
    if not device.uses_cublas:
        return 0
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if not config:
        # As PyTorch decides: Hopper's size only where the GPU says it is one (no GPU to ask: the other).
        hopper = torch.cuda.is_available() and torch.cuda.get_device_capability(device.index)[0] == 9
        config = HOPPER_CUBLAS_WORKSPACE if hopper else OTHER_CUBLAS_WORKSPACE
    return CUBLAS_WORKSPACES_PER_STEP * cublas_workspace_bytes(config)


def estimate_training_memory(
    model: GPTConfig,
    parameters: int,
    batch_size: int,
    precision_bytes: int,
    device: Device,
    gradient_checkpointing: bool = False,
    grad_accum: int = 1,
    *,
    loss_chunk_rows: int,
    compiled: bool = False,
    muon_parameters: int = 0,
    explicit_attention: bool = False,
    saves_while_training: bool = False,
) -> MemoryEstimate:
    """loss_chunk_rows: the fused loss's rows per chunk, as the plan decides it (RunPlan.loss);
    compiled: the step runs under torch.compile (RunPlan.compile); muon_parameters: those Muon
    updates (RunPlan.muon_parameters), AdamW the rest; explicit_attention: attention written out
    (RunPlan.attention), which keeps each layer's (tokens x tokens) weights; saves_while_training:
    the run saves a checkpoint before its last step (saves_before_last_step)."""
    tokens = batch_size * model.sequence_length
    autocast = precision_bytes != FP32
    fp32_floats, low_floats = saved_floats_per_token_per_layer(
        model, autocast, cuda_kernels=device.saves_like_cuda_kernels
    )
    per_layer = tokens * (fp32_floats * FP32 + low_floats * precision_bytes)
    if gradient_checkpointing:
        # Only each block's input is kept; one block's activations are rebuilt at a time in backward.
        blocks = model.n_layer * tokens * model.n_embd * FP32 + per_layer
    else:
        blocks = model.n_layer * per_layer
    # The final norm keeps its fp32 input, and the output head its (compute-dtype) input.
    activations = blocks + tokens * model.n_embd * (FP32 + precision_bytes)
    # The output layer and cross-entropy run fused, loss_chunk_rows rows at a time (model/fused_loss.py;
    # the plan's decision, plan/loss_chunk.py): no full logits exist. Its chunk tensors are allocated
    # once per call and reused by every chunk: fp32 logits and (log-)probabilities (the latter
    # turned into the gradient in place); under autocast also the low-precision logits and gradient.
    # The weight gradient it computed ahead of backward (fp32, vocabulary x width) is kept until
    # backward. Its input gradient replaces the head input the plain Linear saved (in activations).
    chunk = min(loss_chunk_rows, tokens) * chunk_bytes_per_row(model.vocab_size, precision_bytes)
    logits = chunk + model.vocab_size * model.n_embd * FP32
    scores = 0
    score_bytes = batch_size * model.n_head * model.sequence_length**2 * precision_bytes
    # With attention dropout even the fused kernels fall back to the math path, which stores T x T.
    if device.materialises_attention or model.dropout > 0:
        scores = 2 * score_bytes
    if explicit_attention:
        # Softmax's output, saved by every layer (by the one being rebuilt, with checkpointing) for its
        # backward and the weighted values', beside the two its backward computes at the peak.
        scores = max(scores, ((1 if gradient_checkpointing else model.n_layer) + 2) * score_bytes)
    # Autocast caches one low-precision copy of each weight for the forward; backward keeps them.
    autocast_weights = parameters * precision_bytes if autocast else 0
    # AdamW keeps two fp32 moments per parameter; Muon one momentum buffer per hidden matrix. Muon's
    # Newton-Schulz temporaries (bf16, one matrix at a time, freed before the next) are left out.
    optimizer = (2 * (parameters - muon_parameters) + muon_parameters) * FP32
    weights, gradients = parameters * FP32, parameters * FP32
    # With accumulation, micro-batches after the first run beside the gradients summed so far.
    early_gradients = gradients if grad_accum > 1 else 0
    backward_start = dict(
        gradients=early_gradients,
        autocast_weights=autocast_weights,
        activations=activations,
        logits=logits,
        attention_scores=scores,
    )
    # The optimizer step: the model returns no logits with a loss, so none are held to it.
    optimizer_step = dict.fromkeys(backward_start, 0) | {"gradients": gradients}
    parts = max(backward_start, optimizer_step, key=lambda moment: sum(moment.values()))
    allocator = 0
    if device.host_memory:
        runtime = CPU_RUNTIME_BYTES + (CPU_LOW_PRECISION_RUNTIME_BYTES if autocast else 0)
        retained = 0
        if gradient_checkpointing:
            widths = CPU_CHECKPOINT_RETAINED_WIDTHS_AUTOCAST if autocast else CPU_CHECKPOINT_RETAINED_WIDTHS
            retained = model.n_layer * tokens * widths * model.n_embd * precision_bytes
        remade = remade_after_backward(activations, retained, grad_accum, autocast)
        allocator = int(activations * CPU_FREED_ACTIVATIONS_SHARE) + runtime + remade
    workspace = cuda_workspace_bytes(device)
    if device.host_memory and compiled:
        workspace += CPU_COMPILED_RUNTIME_BYTES
    # No allocator share on the copy. Iteration 2 (gpt_42m, AdamW) fp32 batch 4, 16 steps, saving every
    # 4 against only at the end, 2 fresh runs each: the peak grew by 492 and 463 MiB, the copy is 477.
    # Held out, preset small fp32 batch 8 (a 127 MiB state) first grew by about 4 copies (saves made a
    # fresh copy each: background_save.host_copy says how); one copy kept for the run, saving every 2
    # steps: 606.5 MiB against this estimate's 576 (range 490-720). 2026-12-06, 2-core AMD EPYC (Zen 1).
    checkpoint_copy = weights + optimizer if device.host_memory and saves_while_training else 0
    spread = SPREAD.get(device.kind, OTHER_DEVICE_SPREAD)
    return MemoryEstimate(
        weights=weights,
        optimizer=optimizer,
        allocator=allocator,
        workspace=workspace,
        checkpoint_copy=checkpoint_copy,
        **parts,
        spread=spread,
    )


def remade_after_backward(activations: int, retained: int, grad_accum: int, autocast: bool) -> int:
    """CPU: activations allocated again after a backward pass has reshaped glibc's heap.

    glibc keeps freed heap blocks, and a tensor made after a backward lands in them only where a
    hole of its size is free: the backward interleaved gradients and temporaries with the freed
    activations. Without accumulation or checkpointing, the forward reuses the previous step's
    blocks in the same order and CPU_FREED_ACTIVATIONS_SHARE covers the holes a step leaves.

    Gradient accumulation: the second micro-batch's forward runs after the first one's backward,
    beside the gradients it made. With the mmap threshold pinned (MALLOC_MMAP_THRESHOLD_=131072:
    every tensor returned on free) accumulating grew by exactly those gradients (gpt_first_cpu fp32
    b8: 86.2 MiB without, 91.3 accum 2, 91.5 accum 4; gradients 5.1 MiB): no more is alive. Unpinned
    it grew by 14.2 MiB beyond them (94.5 MiB without), and accum 4 held what accum 2 did (114.8 and
    113.8 MiB): the second micro-batch allocates part of its activations anew, and the third and
    later reuse the second's blocks. That part, (unpinned accum 2 - plain - gradients) / one
    micro-batch's activations, was 0.43 (gpt_first_cpu fp32 b8), 0.38 (student modern fp32 b8) and
    0.30 (tiny fp32 b64 with checkpointing): CPU_ACCUMULATION_REMADE = 0.4; under bf16 autocast 0.18
    (gpt_first_cpu bf16 b8; 104.3 MiB without, 112.8 accum 2): CPU_ACCUMULATION_REMADE_AUTOCAST.
    Why bf16's mostly half-size activations leave a smaller share was not measured further. (The
    earlier term, a whole micro-batch's activations, read 1.15-1.19 of the measured peak on held-out
    accumulation shapes.)

    Gradient checkpointing rebuilds each block in backward beside the gradient temporaries of the block
    after it and the parameter gradients made so far, which land between the rebuilt blocks' freed
    memory, so glibc keeps much of it apart (`retained`). What recompute keeps *alive* the estimate
    already counts, and the pinned runs confirm it (growth 49-113 MiB against the live part plus runtime
    of 57-119 MiB on the six fitted fp32 shapes). The unpinned growth beyond the pinned one, less the
    general share of the time (0.12 of the live tensors; CPU_FREED_ACTIVATIONS_SHARE replaced it and
    moved these shapes' estimates by -3.5% to +3.9%), was 8 to 11.4 fp32 widths (n_embd floats) per
    token and layer on the fitted shapes (gpt_first_cpu b8/b24/b48, student classic and modern b16, tiny
    b64; 2026-12-02, 2-core AMD EPYC, 2 fresh processes each): CPU_CHECKPOINT_RETAINED_WIDTHS = 10.
    Under bf16 autocast the same accounting gave 11.1, 18.3 and 14.2 bytes per token, layer and n_embd
    (gpt_first_cpu b24, student classic b16, tiny b64; pinned 88.4, 108.2, 70.6 MiB, unpinned 113.0,
    145.6, 83.2): about 7 bf16 widths (CPU_CHECKPOINT_RETAINED_WIDTHS_AUTOCAST), not the 10 widths at
    the layer's fp32/bf16 mix (22.5 bytes) counted before, which read 1.10-1.22 of the peak on held-out
    bf16 shapes. (The first term, one rebuilt block, read 0.65-0.77 of the measured peak on classic
    shapes.) Pinning the threshold at 1 MiB would keep the saving (81 MiB against 146-161 at
    gpt_first_cpu b24), but the step then ran at 0.68x the speed with checkpointing and 0.72x without
    (medians of 4 interleaved pairs each, gpt_first_cpu b24 and b16), so the runtime leaves glibc alone.

    Measured 2026-12-03 (accumulation, bf16 checkpointing) on a 2-core AMD EPYC (family 25, model 17,
    Zen 4; AVX-512 with AVX512-BF16, no AMX), torch 2.13 CPU, 2 fresh processes per shape and setting
    (verify memory's FITTED_ACCUMULATION and FITTED_BF16_CHECKPOINTING).
    """
    if grad_accum == 1:
        return retained
    return int(activations * (CPU_ACCUMULATION_REMADE_AUTOCAST if autocast else CPU_ACCUMULATION_REMADE)) + retained


def saves_before_last_step(plan) -> bool:
    """Whether the run saves a checkpoint before its last step (the last save comes after the steps):
    every checkpoint_interval steps, when that is under the planned steps (or they are not known)."""
    interval, steps = plan.config.train.checkpoint_interval, plan.planned_steps
    return interval > 0 and (steps is None or interval < steps)


def plan_memory(plan, training: bool = True) -> MemoryEstimate:
    """training: the plan's training run, with its checkpoint saves; False: steps that save nothing
    (a benchmark, a memory check)."""
    train = plan.config.train
    return estimate_training_memory(
        plan.model,
        plan.parameters,
        plan.batch_size,
        plan.precision.activation_bytes,
        plan.device,
        train.gradient_checkpointing,
        train.grad_accum,
        loss_chunk_rows=plan.loss.chunk_rows,
        compiled=plan.compile.enabled,
        muon_parameters=plan.muon_parameters,
        explicit_attention=plan.attention.explicit,
        saves_while_training=training and saves_before_last_step(plan),
    )
