"""Which attention kernel is fastest here, forward + backward, at a profile's attention shape.

    python scripts/attention_kernels.py --batch 16 --heads 4 --length 128 --head-dim 32 --threads 2

Candidates run round-robin in one process (so a competing job slows all alike): torch's
scaled_dot_product_attention with each CPU backend it has (flash, math) and an explicit
matmul-softmax-matmul. Prints each one's median milliseconds and ratio to the default.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def explicit(q, k, v):
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    # q, k, v as the model makes them: views into one (B, T, 3, H, D) projection output.
    qkv = torch.randn(args.batch, args.length, 3, args.heads, args.head_dim, dtype=dtype, requires_grad=True)

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return run

    candidates = {
        "sdpa default": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa math": sdpa(SDPBackend.MATH),
        "explicit matmul-softmax": explicit,
    }
    reference = None
    times = {name: [] for name in candidates}
    for round_ in range(args.rounds + 3):
        for name, fn in candidates.items():
            qkv.grad = None
            begin = time.perf_counter()
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            out = fn(q, k, v)
            out.sum().backward()
            elapsed = time.perf_counter() - begin
            if round_ == 0:
                reference = out.detach() if reference is None else reference
                torch.testing.assert_close(out.detach(), reference, rtol=2e-2, atol=2e-2)
            if round_ >= 3:
                times[name].append(elapsed)
    base = statistics.median(times["sdpa default"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:26s} {median * 1000:8.2f} ms  {base / median:5.2f}x default")


if __name__ == "__main__":
    main()
