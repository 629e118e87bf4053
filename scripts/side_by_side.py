"""BuildLLM's training step against a plain reference GPT on the same shape, interleaved A B A B.

    python scripts/side_by_side.py /path/to/nanoGPT/model.py --profile iteration1 --pairs 10

The reference is a nanoGPT-style `model.py` (GPTConfig, GPT, GPT.configure_optimizers) read from the
path given: its code is never part of this repository. Each side runs in a fresh process per
measurement, alternating ours, reference, ours, reference ..., so a competing job on the machine
slows both sides of a pair alike; each process warms up, then times equal intervals and reports the
median interval's tokens/s. Both train on the same random tokens with the same batch, threads,
learning rate, weight decay, betas and gradient clipping; our step is Trainer.step() as `train`
runs it (data cursor, clipping, schedule, AdamW), the reference's step is nanoGPT's train loop
(random-offset batch, forward, backward, clip, AdamW step, zero_grad).

Prints each side's median tokens/s, the per-pair ratios and their median; exits 1 when the median
ratio misses --target (default: 1.3 at iteration 1, 1.0 elsewhere; the targets of issue 11).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from lab import PROFILES, cpu_plan, random_token_trainer, random_tokens

TARGETS = {"iteration1": 1.3}


def our_plan(args):
    settings = {"train.compile": True} if args.compile else {}
    if args.batch_size:
        settings["train.batch_size"] = args.batch_size
    return cpu_plan(args.profile, args.precision, args.threads, args.architecture, settings)


def ours(args, plan, steps: int):
    return random_token_trainer(plan, steps).step


def reference(args, plan, steps: int):
    spec = importlib.util.spec_from_file_location("reference_model", args.reference)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shape = plan.model
    if shape.architecture != "classic":
        raise SystemExit("the reference implements the classic (GPT-2) architecture only")
    torch.manual_seed(plan.config.seed)
    config = module.GPTConfig(
        block_size=shape.sequence_length,
        vocab_size=shape.vocab_size,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        n_embd=shape.n_embd,
        dropout=shape.dropout,
        bias=True,
    )
    model = module.GPT(config)
    optimizer = model.configure_optimizers(plan.config.train.weight_decay, plan.learning_rate, (0.9, 0.95), "cpu")
    data = random_tokens(shape.vocab_size, (steps + 1) * plan.batch_size * shape.sequence_length + 1)
    clip = plan.config.train.grad_clip
    bf16 = plan.precision.precision == "bf16"
    T, B = shape.sequence_length, plan.batch_size

    def step():
        # nanoGPT's train.py: a batch at random offsets, forward under its autocast context, backward,
        # clip, step, free the gradients.
        ix = torch.randint(len(data) - T, (B,))
        x = torch.stack([data[i : i + T].long() for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + T].long() for i in ix])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _, loss = model(x, y)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def child(args) -> None:
    plan = our_plan(args)
    steps = args.warmup + args.intervals * args.steps
    step = (ours if args.child == "ours" else reference)(args, plan, steps)
    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.intervals):
        begin = time.perf_counter()  # CPU work is synchronous: the interval ends when the last step has
        for _ in range(args.steps):
            step()
        rates.append(args.steps * plan.tokens_per_step / (time.perf_counter() - begin))
    print(json.dumps({"side": args.child, "tokens_per_second": statistics.median(rates), "intervals": rates}))


def turns(args) -> None:
    """--turns: both sides in one process, taking turns of --steps steps for --intervals rounds; on a
    machine whose load changes from minute to minute, a turn's pair of timings is seconds apart,
    so the ratio per turn is fairer than that of two processes minutes apart."""
    plan = our_plan(args)
    total = args.warmup + args.intervals * args.steps
    steps = {"ours": ours(args, plan, total), "reference": reference(args, plan, total)}
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    seconds = {name: [] for name in steps}
    for _ in range(args.intervals):
        for name, step in steps.items():
            begin = time.perf_counter()
            for _ in range(args.steps):
                step()
            seconds[name].append(time.perf_counter() - begin)
    rates = {name: [args.steps * plan.tokens_per_step / t for t in values] for name, values in seconds.items()}
    ratios = [a / b for a, b in zip(rates["ours"], rates["reference"])]
    print(
        json.dumps(
            {
                "ours": statistics.median(rates["ours"]),
                "reference": statistics.median(rates["reference"]),
                "ratio": statistics.median(ratios),
            }
        )
    )


def optional_flags(args) -> list[str]:
    flags = ["--batch-size", str(args.batch_size)] if args.batch_size else []
    flags += ["--architecture", args.architecture] if args.architecture else []
    return flags + (["--compile"] if args.compile else [])


def in_fresh_process(args, side: str) -> dict:
    """This script again in a fresh process, as `--child side`; its last line of output, parsed."""
    command = [sys.executable, __file__, args.reference, "--child", side, "--profile", args.profile]
    command += ["--threads", str(args.threads), "--warmup", str(args.warmup), "--steps", str(args.steps)]
    command += ["--intervals", str(args.intervals), "--precision", args.precision, *optional_flags(args)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{side} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_turns(args) -> tuple[float, float, float]:
    result = in_fresh_process(args, "turns")
    return result["ours"], result["reference"], result["ratio"]


def run_child(args, side: str) -> float:
    return in_fresh_process(args, side)["tokens_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", help="path to the reference's model.py (nanoGPT's)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="iteration1")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per process")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed interval")
    parser.add_argument("--intervals", type=int, default=3, help="timed intervals per process (median taken)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the profile's CPU batch")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument(
        "--architecture", choices=("classic",), default=None, help="the reference has the classic architecture only"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile our model (train.compile: true)")
    parser.add_argument("--target", type=float, default=None, help="median ratio to reach (exit 1 below it)")
    parser.add_argument(
        "--turns",
        action="store_true",
        help="both sides in each fresh process, alternating every --steps steps (see turns())",
    )
    parser.add_argument("--child", choices=("ours", "reference", "turns"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not Path(args.reference).is_file():
        raise SystemExit(f"reference {args.reference} is not a file; pass the path of nanoGPT's model.py")
    if args.child == "turns":
        return turns(args)
    if args.child:
        return child(args)
    target = args.target if args.target is not None else TARGETS.get(args.profile, 1.0)
    print(
        json.dumps(
            {
                "script": "side_by_side",
                "profile": args.profile,
                "pairs": args.pairs,
                "threads": args.threads,
                "precision": args.precision,
                "warmup": args.warmup,
                "steps": args.steps,
                "intervals": args.intervals,
                "turns": args.turns,
                "reference": str(args.reference),
            }
        ),
        flush=True,
    )
    mine, theirs, ratios = [], [], []
    for pair in range(args.pairs):
        if args.turns:
            ours_rate, reference_rate, ratio = run_turns(args)
            mine.append(ours_rate)
            theirs.append(reference_rate)
            ratios.append(ratio)
        else:
            mine.append(run_child(args, "ours"))
            theirs.append(run_child(args, "reference"))
            ratios.append(mine[-1] / theirs[-1])
        print(
            f"pair {pair + 1}/{args.pairs}: ours {mine[-1]:,.0f} tokens/s, reference {theirs[-1]:,.0f} tokens/s, "
            f"ratio {ratios[-1]:.3f}",
            flush=True,
        )
    ratio = statistics.median(ratios)
    print(
        f"{args.profile} ({args.precision}, {args.threads} threads), {args.pairs} interleaved pairs: "
        f"ours median {statistics.median(mine):,.0f} tokens/s, reference median {statistics.median(theirs):,.0f} "
        f"tokens/s; median ratio {ratio:.3f} (pairs min {min(ratios):.3f}, max {max(ratios):.3f}); "
        f"target {target:.2f}: "
        f"{'met' if ratio >= target else 'MISSED'}"
    )
    sys.exit(0 if ratio >= target else 1)


if __name__ == "__main__":
    main()
