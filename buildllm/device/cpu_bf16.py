"""bf16 on the CPU: whether this CPU has a bf16 matmul path at all, and the advice the dry run and
the benchmark print. The figures that decide bf16 against fp32 are this machine's own, measured by
`buildllm tune` and quoted in the plan's precision reason; no other machine's figures decide here.

PyTorch runs CPU bf16 matmuls through oneDNN where the CPU has AVX-512 (with or without AVX512-BF16),
AMX or ARM's bf16 instructions. Elsewhere (an AVX2-only x86 CPU, an ARM CPU without bf16) they take a
generic kernel: on a 2-core AMD EPYC with AVX2 only, torch 2.13, 2 threads, it ran 30-100x slower
than fp32 (2048^3: 0.27 against 104 GFLOP/s; 2048x128 by 128x4096: 0.49 against 49) and a whole
iteration-1 training step 16x slower (5.1 s against 0.32 s). There bf16 is refused, not run."""

from __future__ import annotations

import torch


def native_bf16() -> bool:
    """oneDNN's own check that it computes bf16 matmuls on this CPU (AVX-512, AMX or ARM bf16)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


NO_BF16_PATH = (
    "this CPU has no bf16 matmul path in PyTorch (oneDNN needs AVX-512, AMX or ARM bf16; here bf16 "
    "matmuls take a generic kernel tens of times slower than fp32)"
)


def refuse_without_bf16_path() -> str:
    """Why an explicit bf16 on this CPU is refused, or "" where it may run (the lab's tools ask it too)."""
    if native_bf16():
        return ""
    return (
        f"precision bf16 requested, but {NO_BF16_PATH}; use --precision fp32 (or auto) here, "
        "and bf16 on a CPU with AVX-512 or AMX, or on a GPU"
    )


def precision_advice(plan) -> str:
    """One sentence for the dry run and the benchmark; empty off the CPU."""
    if plan.device.kind != "cpu":
        return ""
    if not native_bf16():
        return f"{NO_BF16_PATH}: fp32, and bf16 is refused"
    where = "this CPU computes bf16 in oneDNN (AVX-512, AMX or ARM bf16)"
    if plan.precision.precision == "bf16":
        return f"{where}; {plan.precision.reason}"
    return (
        f"{where}; fp32 stays the CPU default unless `buildllm tune` measures bf16 autocast conclusively "
        f"faster here with the same validation loss ({plan.precision.reason}); --precision bf16 to use it anyway"
    )
