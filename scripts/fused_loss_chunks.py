"""The output layer + cross-entropy, forward and backward: plain against fused at several chunk sizes.

    python scripts/fused_loss_chunks.py --rows 2048 --width 128 --vocab 4096 --threads 2

Candidates are timed round-robin in one process (A B C ... A B C ...), so a competing job slows all
alike; prints each one's median milliseconds and its ratio to the plain computation.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from buildllm.model import fused_loss
from buildllm.model.fused_loss import linear_cross_entropy, plain_linear_cross_entropy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--chunks", default="128,256,512,1024,2048", help="rows per chunk to try")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(args.rows, args.width, requires_grad=True)
    weight = (torch.randn(args.vocab, args.width) * 0.02).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.rows,))
    candidates = {"plain": (plain_linear_cross_entropy, None)}
    for rows in map(int, args.chunks.split(",")):
        candidates[f"fused, {rows}-row chunks ({rows * args.vocab * 4 / 2**20:.1f} MiB)"] = (linear_cross_entropy, rows)
    times = {name: [] for name in candidates}
    for round_ in range(args.rounds + 2):
        for name, (fn, rows) in candidates.items():
            if rows:
                fused_loss.CHUNK_BYTES = rows * 4 * args.vocab
            x.grad = weight.grad = None
            begin = time.perf_counter()
            fn(x, weight, targets).backward()
            if round_ >= 2:  # the first rounds warm caches and allocator
                times[name].append(time.perf_counter() - begin)
    plain = statistics.median(times["plain"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:40s} {median * 1000:8.2f} ms  {plain / median:5.2f}x plain")


if __name__ == "__main__":
    main()
