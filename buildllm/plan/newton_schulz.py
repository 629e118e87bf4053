"""The precision of Muon's orthogonalisation (its Newton-Schulz iterations), and why.

torch.optim.Muon always iterates in bf16. That is fast where the device multiplies bf16 matrices
natively (a GPU; a CPU whose oneDNN has AVX-512, AMX or ARM bf16), and on any other CPU it takes the
generic bf16 kernel that device/cpu_bf16.py refuses for training: on a 2-core AMD EPYC with AVX2
only (family 23 model 1, torch 2.13, 2 threads), Muon's step for iteration 1's sixteen hidden
matrices took 787 ms in bf16 and 51 ms in fp32 (medians of 6 interleaved rounds, x15.3), two thirds
of the whole default step. There the plan iterates in fp32, which is also the more exact.
"""

from __future__ import annotations

from buildllm.device.cpu_bf16 import NO_BF16_PATH, native_bf16

BF16, FP32 = "bf16", "fp32"


def decide_newton_schulz(device) -> tuple[str, str]:
    """(precision, why) of Muon's Newton-Schulz iterations on this Device."""
    if not device.host_memory:
        return BF16, f"bf16 (torch.optim.Muon's): {device.device} multiplies bf16 matrices natively"
    if native_bf16():
        return BF16, "bf16 (torch.optim.Muon's): this CPU computes bf16 matmuls in oneDNN"
    return FP32, f"fp32, not torch.optim.Muon's bf16: {NO_BF16_PATH}"
