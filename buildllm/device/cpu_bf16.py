"""Precision advice on the CPU: where the CPU computes bf16 natively (AVX512-BF16 or AMX), say so,
and point to what decides it. The figures themselves are this machine's own, measured by `buildllm
tune` and quoted in the plan's precision reason; no other machine's figures decide or advise here."""

from __future__ import annotations

import torch


def native_bf16() -> bool:
    """oneDNN's own check: AVX512-BF16 or AMX present (bf16 autocast runs elsewhere too, emulated)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def precision_advice(plan, native: bool | None = None) -> str:
    """One sentence for the dry run and the benchmark; empty off the CPU or without native bf16."""
    if plan.device.kind != "cpu":
        return ""
    if not (native_bf16() if native is None else native):
        return ""
    where = "this CPU computes bf16 natively (AVX512-BF16 or AMX)"
    if plan.precision.precision == "bf16":
        return f"{where}; {plan.precision.reason}"
    return (
        f"{where}; fp32 stays the CPU default unless `buildllm tune` measures bf16 autocast conclusively "
        f"faster here with the same validation loss ({plan.precision.reason}); --precision bf16 to use it anyway"
    )
