"""Precision advice on the CPU, from measurement: fp32 stays the default; where the CPU computes
bf16 natively (AVX512-BF16 or AMX), say so and quote what bf16 autocast measured for this profile
(cpu_bf16_measurements.yaml, written by scripts/bf16_gain.py)."""

from __future__ import annotations

from importlib import resources

import torch
import yaml


def native_bf16() -> bool:
    """oneDNN's own check: AVX512-BF16 or AMX present (bf16 autocast runs elsewhere too, emulated)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def measurements() -> dict:
    path = resources.files("buildllm.device") / "cpu_bf16_measurements.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def precision_advice(plan, native: bool | None = None, figures: dict | None = None) -> str:
    """One sentence for the dry run and the benchmark; empty off the CPU or without native bf16."""
    if plan.device.kind != "cpu":
        return ""
    if not (native_bf16() if native is None else native):
        return ""
    measured = (measurements() if figures is None else figures).get(plan.profile.name)
    if measured is None:
        figure = f"bf16 autocast was not measured for profile {plan.profile.name} (scripts/bf16_gain.py measures it)"
    else:
        figure = (f"bf16 autocast measured x{measured['bf16_speedup']:.2f} fp32's training speed for profile "
                  f"{plan.profile.name} ({measured['source']})")
    if plan.precision.precision == "bf16":
        return f"this CPU computes bf16 natively (AVX512-BF16 or AMX); {figure}"
    return (f"this CPU computes bf16 natively (AVX512-BF16 or AMX); {figure}; fp32 stays the CPU default "
            "(bf16 rounds activations to 8 bits of mantissa): --precision bf16 to use it")
