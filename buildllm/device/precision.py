"""What a precision means on a device: its dtype, the autocast and gradient scaler that go with it,
and which precisions the device trains in (an explicit one it lacks is refused with advice)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from buildllm.device import cpu_bf16
from buildllm.device.device import Device
from buildllm.device.peak_flops import DTYPES
from buildllm.errors import DeviceUnavailable


@dataclass(frozen=True)
class PrecisionDecision:
    precision: str  # fp32 | bf16 | fp16
    grad_scaler: bool
    tf32_enabled: bool
    tensor_cores_enabled: bool
    reason: str

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return None if self.precision == "fp32" else DTYPES[self.precision]

    @property
    def activation_bytes(self) -> int:
        return DTYPES[self.precision].itemsize


def cuda_capability(device: Device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device.index)


def cuda_has_bf16(device: Device) -> bool:
    # Ampere (8.0) and newer have bf16 tensor cores; older GPUs emulate it slowly or not at all.
    return cuda_capability(device) >= (8, 0)


def tunable_precisions(device: Device) -> list[str]:
    """fp32 first (the reference `buildllm tune` measures against), then the low precisions this device trains in."""
    candidates = {"mps": ["fp32", "fp16"], "xla": ["fp32", "bf16"]}.get(device.kind, ["fp32", "bf16", "fp16"])
    return [precision for precision in candidates if trains_in(precision, device)]


def fp32_only_reason(device: Device) -> str:
    if device.kind == "cpu" and not cpu_bf16.native_bf16():
        return cpu_bf16.NO_BF16_PATH
    return f"{device.kind} trains in fp32 only"


def trains_in(precision: str, device: Device) -> bool:
    try:
        refuse_unsupported(precision, device)
    except DeviceUnavailable:
        return False
    return True


def refuse_unsupported(precision: str, device: Device) -> None:
    if device.kind == "cuda" and precision == "bf16" and not cuda_has_bf16(device):
        major, minor = cuda_capability(device)
        name = torch.cuda.get_device_name(device.index)
        raise DeviceUnavailable(
            f"precision bf16 requested but {name} (compute capability {major}.{minor}) has no bf16 support; "
            "use --precision fp16 (gradient scaling) or fp32"
        )
    if device.kind == "cpu" and precision == "fp16":
        raise DeviceUnavailable(
            "precision fp16 requested on the CPU, which has no fast fp16 training path (fp16 needs a GPU with "
            "gradient scaling); use --precision bf16 (autocast) or fp32 on the CPU"
        )
    if device.kind == "cpu" and precision == "bf16" and (why := cpu_bf16.refuse_without_bf16_path()):
        raise DeviceUnavailable(why)


def native_precision(device: Device) -> tuple[str, str]:
    """(precision, why) for `auto` where the profile names none: what this kind of device trains in best."""
    if device.kind == "cuda":
        major, minor = cuda_capability(device)
        if cuda_has_bf16(device):
            return "bf16", f"auto: compute capability {major}.{minor} has bf16 tensor cores"
        return "fp16", f"auto: compute capability {major}.{minor} has no bf16; fp16 with gradient scaling"
    if device.kind == "xla":
        return "bf16", "auto: XLA devices compute natively in bf16"
    if device.kind == "mps":
        return "fp32", "auto: MPS autocast is partial and bf16 needs macOS 14+; fp32 is the safe default"
    return "fp32", "auto: CPU training defaults to fp32 (bf16 autocast when asked for, or measured faster here)"


def precision_decision(precision: str, device: Device, origin: str) -> PrecisionDecision:
    on_cuda = device.kind == "cuda"
    tf32 = on_cuda and cuda_capability(device) >= (8, 0)
    tensor_cores = on_cuda and (tf32 or (precision != "fp32" and cuda_capability(device) >= (7, 0)))
    notes = {
        ("cpu", "bf16"): "bf16 autocast on the CPU; weights and optimizer state stay fp32",
        ("mps", "bf16"): "bf16 autocast on MPS needs macOS 14+",
    }
    extra = notes.get((device.kind, precision))
    reason = f"{precision}: {origin}" + (f"; {extra}" if extra else "")
    return PrecisionDecision(
        precision, grad_scaler=precision == "fp16", tf32_enabled=tf32, tensor_cores_enabled=tensor_cores, reason=reason
    )


def apply_matmul_settings(decision: PrecisionDecision) -> None:
    """On CUDA, let fp32 matmuls use TF32 tensor cores ("high" precision); elsewhere leave torch's defaults."""
    if decision.tf32_enabled:
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True


def autocast(decision: PrecisionDecision, device: Device):
    if decision.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.autocast_type, dtype=decision.autocast_dtype)


def grad_scaler(decision: PrecisionDecision, device: Device) -> torch.amp.GradScaler:
    """fp16 gradients underflow without loss scaling; for bf16 and fp32 the scaler is a no-op."""
    return torch.amp.GradScaler(device.kind, enabled=decision.grad_scaler)
