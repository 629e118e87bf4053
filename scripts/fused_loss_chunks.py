"""The output layer + cross-entropy, forward and backward: plain against fused at several chunk sizes.

    python scripts/fused_loss_chunks.py --rows 2048 --width 128 --vocab 4096 --threads 2
    python scripts/fused_loss_chunks.py --device cuda --precision bf16 --rows 65536 --width 768 \
        --vocab 16384 --chunks 4096,8192,16384,32768,65536

Candidates are timed round-robin in one process (A B C ... A B C ...), so a competing job slows all
alike; prints each one's median milliseconds and its ratio to the plain computation. The plan's
own choice for these rows on this device (buildllm/plan/loss_chunk.py) is printed first.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from buildllm.model.fused_loss import linear_cross_entropy, plain_linear_cross_entropy
from buildllm.plan.device import resolve_device
from buildllm.plan.loss_chunk import decide_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--chunks", default="128,256,512,1024,2048", help="rows per chunk to try")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    low = args.precision == "bf16"
    print(f"plan: {decide_loss(args.vocab, args.rows, 2 if low else 4, device).reason}")
    x = torch.randn(args.rows, args.width, device=device.device, requires_grad=True)
    weight = (torch.randn(args.vocab, args.width, device=device.device) * 0.02).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.rows,), device=device.device)
    candidates = {"plain": plain_linear_cross_entropy}
    for rows in map(int, args.chunks.split(",")):
        name = f"fused, {rows}-row chunks ({rows * args.vocab * 4 / 2**20:.1f} MiB)"
        candidates[name] = lambda x, weight, targets, rows=rows: linear_cross_entropy(x, weight, targets, rows)
    times = {name: [] for name in candidates}
    for round_ in range(args.rounds + 2):
        for name, fn in candidates.items():
            x.grad = weight.grad = None
            begin = device.timed()
            with torch.autocast(device.autocast_type, dtype=torch.bfloat16, enabled=low):
                loss = fn(x, weight, targets)
            loss.backward()
            if round_ >= 2:  # the first rounds warm caches and allocator
                times[name].append(device.timed() - begin)
    plain = statistics.median(times["plain"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:40s} {median * 1000:8.2f} ms  {plain / median:5.2f}x plain")


if __name__ == "__main__":
    main()
