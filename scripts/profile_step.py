"""Where a training step's time goes: torch.profiler over Trainer.step() on random tokens.

    python scripts/profile_step.py --profile iteration1 --steps 5

Prints the share of self CPU time per operator group (matmuls, attention, cross-entropy, GELU,
fills, copies, optimizer, the rest) and the top operators, for the before/after tables of issue 11.
"""

from __future__ import annotations

import argparse
import collections
import time

from lab import PROFILES, cpu_plan, random_token_trainer
from torch.profiler import ProfilerActivity, profile

# An operator goes to the first group with a key in its name, so the norms come before the
# optimizer's "norm" (gradient clipping's vector norm). On the CPU the flash attention kernel does
# its own softmax: an aten::_softmax in a step is the fused loss's (or math attention's, with dropout).
GROUPS = [
    ("matmuls (mm, addmm, bmm)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul")),
    ("attention", ("flash_attention", "efficient_attention", "scaled_dot_product")),
    (
        "cross-entropy",
        (
            "log_softmax",
            "nll_loss",
            "aten::logsumexp",
            "aten::exp",
            "chunked_cross_entropy",
            "aten::gather",
            "aten::scatter",
            "aten::_softmax",
            "LinearCrossEntropy",
        ),
    ),
    ("gelu / silu", ("gelu", "silu")),
    ("fill_ / zero_", ("aten::fill_", "aten::zero_")),
    ("copies", ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy")),
    ("norms", ("layer_norm", "rms_norm")),
    ("optimizer + clipping", ("adam", "foreach", "aten::_fused_adamw", "norm")),
]


def group_of(name: str) -> str:
    for label, keys in GROUPS:
        if any(key in name for key in keys):
            return label
    return "the rest"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="iteration1", choices=sorted(PROFILES))
    parser.add_argument("--architecture", choices=("classic", "modern"), default=None)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()

    plan = cpu_plan(args.profile, args.precision, args.threads, args.architecture)
    trainer = random_token_trainer(plan, args.warmup + args.steps)
    length, batch = plan.model.sequence_length, plan.batch_size
    for _ in range(args.warmup):
        trainer.step()
    begin = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            trainer.step()
    seconds = (time.perf_counter() - begin) / args.steps
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    shares, calls = collections.Counter(), collections.Counter()
    for e in events:
        shares[group_of(e.key)] += e.self_cpu_time_total
        if e.key in ("aten::fill_", "aten::zero_", "aten::copy_"):
            calls[e.key] += e.count
    print(
        f"{args.profile} {plan.model.architecture} {args.precision}, batch {batch} x {length}, "
        f"{args.threads} threads: {seconds * 1000:.0f} ms/step under the profiler"
    )
    print("| group | share |\n| --- | --- |")
    for label, value in shares.most_common():
        print(f"| {label} | {value / total:.1%} |")
    print("calls per step: " + ", ".join(f"{k} {v // args.steps}" for k, v in calls.items()))
    print(f"top {args.top} operators by self CPU time:")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"  {e.key:60s} {e.self_cpu_time_total / total:6.1%}  calls/step {e.count // args.steps}")


if __name__ == "__main__":
    main()
