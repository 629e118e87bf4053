"""BuildLLM's training step against a plain reference GPT on the same shape, per profile and precision, interleaved.

    python -m lab.side_by_side /path/to/nanoGPT/model.py --profile all --pairs 3 --json-out side_by_side.json
    python -m lab.side_by_side /path/to/nanoGPT/model.py --profile iteration1 --pairs 10

The reference is a nanoGPT-style `model.py` (GPTConfig, GPT, GPT.configure_optimizers) read from the
path given: its code is never part of this repository. Both train on the same random tokens with the
same batch, threads, learning rate, weight decay, betas and gradient clipping; our step is
Trainer.step() as `train` runs it (data cursor, clipping, schedule, AdamW), the reference's step is
nanoGPT's train loop (random-offset batch, forward under autocast, backward, clip, AdamW step,
zero_grad). Our plan is the stated defaults (loss chunk, attention, compile), whatever tune's record
in metrics/tune.json says, so a figure does not change because `buildllm tune` or `dvc repro` ran in
this folder; --tuned reads this machine's record as `train` does. The start line names both decisions.

What runs: `--profile` takes one or more names, or `all` (the CPU profiles iteration1, tiny, student
and small; the GPU profiles iteration2 and iteration3 only when named). `--precision` is fp32, bf16
or both; by default fp32 when one profile is named (as before) and both for `all` or several. On a
CPU without a bf16 matmul path (buildllm/device/cpu_bf16.py) bf16 is refused, and `both` measures fp32
alone and says why.

How pairs are formed. Every measurement is a fresh process: it warms up, times --intervals equal
intervals of --steps steps and reports the median interval's tokens/s. With one precision a profile
runs --pairs rounds of two processes, ours then reference; a round is a pair. With both precisions a
round is four processes, reference fp32, ours fp32, ours bf16, reference bf16, and every other round
runs those four in reverse order. Each round then gives one pair of each comparison, always of two
neighbouring processes, whose first member alternates from round to round:

    ours/nanoGPT fp32   ours fp32 against reference fp32
    ours/nanoGPT bf16   ours bf16 against reference bf16
    bf16/fp32 (ours)    ours bf16 against ours fp32 (the issue's bf16 target is against our own fp32)

so a competing job, or a load that rises or falls during the run, slows both members of a pair alike.
Each pair's line is printed as its round ends; at the end a table has one row per comparison (the
medians of each side, the median pair ratio, the pairs' min and max, the target and met/MISSED).
Exits 1 when any row with a target misses it (TARGETS; --target sets every ours/nanoGPT row's).
--json-out writes the whole result as JSON, atomically.

--turns runs both sides in each fresh process instead (see turns()); it takes one profile at one
precision and is refused with several.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from buildllm.device import cpu_bf16
from buildllm.device.machine import fingerprint
from buildllm.model.flops import flops_per_token, matmul_parameters
from buildllm.model.gpt import build_model
from lab.harness import PROFILES, cpu_plan, random_token_trainer, random_tokens

# `--profile all`: the profiles whose CPU run is practical (iteration2 and iteration3 are GPU profiles).
CPU_PROFILES = ("iteration1", "tiny", "student", "small")
OURS_VS_REFERENCE = "ours/nanoGPT"
BF16_VS_FP32 = "bf16/fp32 (ours)"
# The ratios to reach, per comparison and precision, by profile (None: report only, no verdict); the
# targets of issue 11. --target replaces the two ours/nanoGPT tables with one number.
TARGETS = {
    (OURS_VS_REFERENCE, "fp32"): {"iteration1": 1.3, "student": 1.2, "small": 1.2, "default": 1.0},
    (OURS_VS_REFERENCE, "bf16"): {"default": 1.0},
    (BF16_VS_FP32, "bf16"): {"iteration1": 1.2, "small": 1.5, "default": None},
}
# Per process: untimed warm-up steps, steps per timed interval, timed intervals; about 5-20 s of work on
# 2 cores at the CPU profiles, so `--profile all --precision both --pairs 3` takes 10-12 minutes there.
WORK = {
    "tiny": (5, 20, 3),
    "iteration1": (5, 10, 3),
    "student": (3, 8, 3),
    "small": (3, 4, 3),
    "iteration2": (2, 2, 3),
    "iteration3": (2, 2, 3),
}
# For the rough time estimate: training FLOP/s per core, in fp32. A 2-core AMD EPYC trains iteration1 at
# ~13,000 tokens/s and small at ~1,700 (8.7 and 68 MFLOP per token): ~115 GFLOP/s on 2 cores, both.
ROUGH_FLOPS_PER_CORE = 57e9
ROUGH_STARTUP_SECONDS = 6.0  # a fresh process: import torch and buildllm, build the model


def our_plan(args, profile: str, precision: str, apply: bool = True):
    # The reference steps AdamW on every parameter: ours too (the classic recipe), like for like.
    settings = {"train.recipe": "classic", **({"train.compile": True} if args.compile else {})}
    if args.batch_size:
        settings["train.batch_size"] = args.batch_size
    return cpu_plan(profile, precision, args.threads, args.architecture, settings, apply, tuned=args.tuned)


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
    if not shape.tied_output and hasattr(model, "lm_head"):  # tiny classic: its own output layer, as ours
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
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
    # The reference's process runs as nanoGPT's train.py would: our plan sets only its threads, none of
    # the process-wide settings apply_plan makes for ours (glibc's thresholds: buildllm/device/allocator.py).
    plan = our_plan(args, args.profile[0], args.precision, apply=args.child == "ours")
    if args.child != "ours":
        torch.set_num_threads(plan.threads)
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
    so the ratio per turn is fairer than that of two processes minutes apart. Both sides share the
    process's settings, glibc's thresholds (buildllm/device/allocator.py) included, which the reference's
    own process would not have."""
    plan = our_plan(args, args.profile[0], args.precision)
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
    return flags + (["--compile"] if args.compile else []) + (["--tuned"] if args.tuned else [])


def in_fresh_process(args, side: str, profile: str, precision: str, work: tuple[int, int, int]) -> dict:
    """This script again in a fresh process, as `--child side` for one profile at one precision; its
    last line of output, parsed, with the process's wall-clock seconds."""
    warmup, steps, intervals = work
    command = [sys.executable, "-m", "lab.side_by_side", args.reference, "--child", side, "--profile", profile]
    command += ["--threads", str(args.threads), "--warmup", str(warmup), "--steps", str(steps)]
    command += ["--intervals", str(intervals), "--precision", precision, *optional_flags(args)]
    begin = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{side} ({profile} {precision}) failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "seconds": time.perf_counter() - begin}


@dataclass
class Comparison:
    """One row of the summary: a profile's comparison at one precision, pair by pair."""

    profile: str
    precision: str
    comparison: str
    target: float | None
    mine: list[float] = field(default_factory=list)  # ours (bf16 in the bf16/fp32 row)
    theirs: list[float] = field(default_factory=list)  # the reference (our fp32 in the bf16/fp32 row)
    ratios: list[float] = field(default_factory=list)

    def add(self, mine: float, theirs: float, ratio: float | None = None) -> None:
        self.mine.append(mine)
        self.theirs.append(theirs)
        self.ratios.append(mine / theirs if ratio is None else ratio)

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "report only"
        return "met" if self.ratio >= self.target else "MISSED"

    def label(self) -> str:
        return (
            f"{self.profile} {self.precision}"
            if self.comparison == OURS_VS_REFERENCE
            else f"{self.profile} {self.comparison}"
        )

    def pair_line(self, total: int) -> str:
        names = ("ours", "reference") if self.comparison == OURS_VS_REFERENCE else ("bf16", "fp32")
        return (
            f"{self.label()} pair {len(self.ratios)}/{total}: {names[0]} {self.mine[-1]:,.0f} tokens/s, "
            f"{names[1]} {self.theirs[-1]:,.0f} tokens/s, ratio {self.ratios[-1]:.3f}"
        )

    def record(self) -> dict:
        return {
            "profile": self.profile,
            "precision": self.precision,
            "comparison": self.comparison,
            "ours_tokens_per_second": statistics.median(self.mine),
            "other_tokens_per_second": statistics.median(self.theirs),
            "ratio": self.ratio,
            "ratio_min": min(self.ratios),
            "ratio_max": max(self.ratios),
            "pairs": len(self.ratios),
            "target": self.target,
            "verdict": self.verdict,
            "pair_ratios": self.ratios,
            "pair_ours": self.mine,
            "pair_other": self.theirs,
        }


def target_of(comparison: str, precision: str, profile: str, override: float | None) -> float | None:
    if override is not None and comparison == OURS_VS_REFERENCE:
        return override
    table = TARGETS[(comparison, precision)]
    return table.get(profile, table["default"])


def table(rows: list[Comparison]) -> str:
    header = ("profile", "precision", "comparison", "ours tok/s", "other tok/s", "ratio", "min", "max", "pairs")
    header += ("target", "verdict")
    lines = [
        (
            row.profile,
            row.precision,
            row.comparison,
            f"{statistics.median(row.mine):,.0f}",
            f"{statistics.median(row.theirs):,.0f}",
            f"{row.ratio:.3f}",
            f"{min(row.ratios):.3f}",
            f"{max(row.ratios):.3f}",
            str(len(row.ratios)),
            "-" if row.target is None else f"{row.target:.2f}",
            row.verdict,
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]
    left = {0, 1, 2, 10}  # text columns; the figures are right-aligned

    def format_line(cells) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join(format_line(cells).rstrip() for cells in [header, *lines])


def cpu_info() -> dict:
    """The CPU as the machine stage fingerprints it (device/machine.py): its model, kind and bf16 instructions."""
    record = fingerprint()
    keys = ("cpu_kind", "amx_bf16", "avx512_bf16")
    return {"model": record["cpu_model"], **{k.removeprefix("cpu_"): record[k] for k in keys}}


def rough_seconds(plan, work: tuple[int, int, int], threads: int) -> float:
    """A rough wall time of one fresh process of `plan`: its steps' FLOPs at the rough fp32 rate, plus start-up."""
    per_token = flops_per_token(plan.model, matmul_parameters(build_model(plan.model, "meta")))
    warmup, steps, intervals = work
    step = plan.tokens_per_step * per_token / (ROUGH_FLOPS_PER_CORE * threads)
    return ROUGH_STARTUP_SECONDS + (warmup + steps * intervals) * step


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def expand_profiles(names: list[str]) -> list[str]:
    chosen = []
    for name in names:
        for profile in CPU_PROFILES if name == "all" else (name,):
            if profile not in chosen:
                chosen.append(profile)
    return chosen


def round_order(precisions: list[str], number: int) -> list[tuple[str, str]]:
    """The fresh processes of round `number` (from 0), in order: (side, precision)."""
    if len(precisions) == 1:
        return [("ours", precisions[0]), ("reference", precisions[0])]
    order = [("reference", "fp32"), ("ours", "fp32"), ("ours", "bf16"), ("reference", "bf16")]
    return order if number % 2 == 0 else order[::-1]


def measure_profile(args, profile: str, precisions: list[str], work: tuple[int, int, int], plan):
    """--pairs rounds of fresh processes of `profile` (see round_order), each pair's line printed as its
    round ends; the profile's comparisons, and every process's measurement."""
    rows = {
        (OURS_VS_REFERENCE, q): Comparison(
            profile, q, OURS_VS_REFERENCE, target_of(OURS_VS_REFERENCE, q, profile, args.target)
        )
        for q in precisions
    }
    if len(precisions) == 2:
        rows[BF16_VS_FP32, "bf16"] = Comparison(
            profile, "bf16", BF16_VS_FP32, target_of(BF16_VS_FP32, "bf16", profile, None)
        )
    if args.turns:
        order = f"one fresh process in which both sides take turns of {work[1]} steps"
    elif len(precisions) == 1:
        order = "fresh processes ours, reference"
    else:
        order = "fresh processes reference fp32, ours fp32, ours bf16, reference bf16 (reversed every other round)"
    warmup, steps, intervals = work
    print(
        f"== {profile} {' and '.join(precisions)}: threads {args.threads}, batch {plan.batch_size} x "
        f"{plan.model.sequence_length}, per process warm-up {warmup} + timed {intervals} x {steps} steps; "
        f"rounds {args.pairs}, each {order} ==",
        flush=True,
    )
    measurements = []
    for number in range(args.pairs):
        if args.turns:
            result = in_fresh_process(args, "turns", profile, precisions[0], work)
            measurements.append({"profile": profile, "precision": precisions[0], "round": number, **result})
            rows[OURS_VS_REFERENCE, precisions[0]].add(result["ours"], result["reference"], result["ratio"])
        else:
            rates = {}
            for side, q in round_order(precisions, number):
                result = in_fresh_process(args, side, profile, q, work)
                rates[side, q] = result["tokens_per_second"]
                measurements.append({"profile": profile, "precision": q, "round": number, **result})
            for q in precisions:
                rows[OURS_VS_REFERENCE, q].add(rates["ours", q], rates["reference", q])
            if len(precisions) == 2:
                rows[BF16_VS_FP32, "bf16"].add(rates["ours", "bf16"], rates["ours", "fp32"])
        for row in rows.values():
            print(row.pair_line(args.pairs), flush=True)
    return list(rows.values()), measurements


def write_json(path: Path, result: dict) -> None:
    from buildllm.atomic import atomic_write_text  # a temp file beside `path`, fsynced, renamed over it

    atomic_write_text(path, json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", help="path to the reference's model.py (nanoGPT's)")
    parser.add_argument(
        "--profile",
        nargs="+",
        choices=["all", *sorted(PROFILES)],
        metavar="PROFILE",
        default=["iteration1"],
        help=f"one or more of {', '.join(sorted(PROFILES))}, or all: {', '.join(CPU_PROFILES)} "
        "(the GPU profiles only when named); default iteration1",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "both"),
        default=None,
        help="default: fp32 when one profile is named, both for `all` or several profiles",
    )
    parser.add_argument("--pairs", type=int, default=8, help="rounds per profile: pairs of each comparison (8)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each side (2)")
    work = ", ".join(f"{name} {w}/{s}/{i}" for name, (w, s, i) in WORK.items())
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per process (default per profile)")
    parser.add_argument("--steps", type=int, default=None, help="steps per timed interval (default per profile)")
    parser.add_argument(
        "--intervals",
        type=int,
        default=None,
        help=f"timed intervals per process, median taken; default per profile as warmup/steps/intervals: {work}",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="default: each profile's CPU batch")
    parser.add_argument(
        "--architecture",
        choices=("classic",),
        default="classic",  # student's own default is modern, which the reference does not implement
        help="the reference has the classic architecture only",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile our model (train.compile: true)")
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="our plan reads this machine's tune record (metrics/tune.json) as `train` does: its loss chunk, "
        "attention and compile; default: the stated defaults, the same plan whether or not tune ran here",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="the median ours/nanoGPT ratio every profile and precision must reach, instead of TARGETS "
        "(fp32: iteration1 1.3, student and small 1.2, others 1.0; bf16: 1.0); bf16/fp32 (ours) keeps "
        "its own (iteration1 1.2, small 1.5, others report only). Exits 1 when any row misses its target",
    )
    parser.add_argument(
        "--turns",
        action="store_true",
        help="both sides in each fresh process, alternating every --steps steps (see turns()); "
        "one profile at one precision only",
    )
    parser.add_argument("--json-out", type=Path, default=None, help="also write the whole result as JSON here")
    parser.add_argument("--child", choices=("ours", "reference", "turns"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not Path(args.reference).is_file():
        raise SystemExit(f"reference {args.reference} is not a file; pass the path of nanoGPT's model.py")
    if args.child:
        if len(args.profile) != 1 or args.profile[0] == "all" or args.precision not in ("fp32", "bf16"):
            raise SystemExit("--child measures one profile at one precision")
        return turns(args) if args.child == "turns" else child(args)
    profiles = expand_profiles(args.profile)
    several = "all" in args.profile or len(profiles) > 1
    precision = args.precision or ("both" if several else "fp32")
    precisions = ["fp32", "bf16"] if precision == "both" else [precision]
    if "bf16" in precisions and (refused := cpu_bf16.refuse_without_bf16_path()):
        if precision == "bf16":
            parser.error(refused)
        precisions = ["fp32"]
    if args.turns and (len(profiles) > 1 or len(precisions) > 1):
        parser.error(
            "--turns measures one profile at one precision: name one --profile and --precision fp32 or bf16 "
            "(without --turns, several profiles and both precisions run as interleaved fresh processes)"
        )
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    explicit = (args.warmup, args.steps, args.intervals)
    works = {p: tuple(e if e is not None else d for e, d in zip(explicit, WORK[p])) for p in profiles}
    # Each profile's plan, for its batch and shape (the same at either precision).
    plans = {p: our_plan(args, p, precisions[0]) for p in profiles}
    per_round = 1 if args.turns else len(round_order(precisions, 0))
    estimate = sum(
        args.pairs * per_round * rough_seconds(plans[p], works[p], args.threads) * (2 if args.turns else 1)
        for p in profiles
    )
    start = {
        "script": "side_by_side",
        "profiles": profiles,
        "precisions": precisions,
        "pairs": args.pairs,
        "threads": args.threads,
        "work": {p: dict(zip(("warmup", "steps", "intervals"), works[p])) for p in profiles},
        "batch": {p: [plans[p].batch_size, plans[p].model.sequence_length] for p in profiles},
        "turns": args.turns,
        "compile": args.compile,
        # What our plan made of the loss and attention: the stated defaults, or a tune record's (--tuned).
        "plan": {p: {key: plans[p].decisions[key] for key in ("loss", "attention")} for p in profiles},
        "reference": str(args.reference),
        "cpu": cpu_info(),
        "load_average": os.getloadavg()[0],
        "processes": args.pairs * per_round * len(profiles),
        "rough_estimate_seconds": round(estimate),
    }
    print(json.dumps(start), flush=True)
    if precision == "both" and precisions == ["fp32"]:
        print(f"fp32 only: {cpu_bf16.NO_BF16_PATH}", flush=True)
    print(
        f"rough estimate: about {duration(estimate)} for {start['processes']} fresh processes (each step's FLOPs "
        f"at ~{ROUGH_FLOPS_PER_CORE / 1e9:.0f} GFLOP/s per core, a 2-core AMD EPYC's fp32 speed, plus "
        f"~{ROUGH_STARTUP_SECONDS:.0f} s to start each process; bf16 and the reference counted as fast as our fp32)",
        flush=True,
    )
    began = time.perf_counter()
    rows, measurements = [], []
    for profile in profiles:
        measured = measure_profile(args, profile, precisions, works[profile], plans[profile])
        rows += measured[0]
        measurements += measured[1]
    elapsed = time.perf_counter() - began
    missed = [row for row in rows if row.verdict == "MISSED"]
    print(f"\nsummary (threads {args.threads}, {start['cpu']['model']}; took {duration(elapsed)}):")
    print(table(rows))
    print(
        f"{len(missed)} of {sum(row.target is not None for row in rows)} targets MISSED"
        if missed
        else "all targets met"
    )
    if args.json_out:
        result = {**start, "seconds": elapsed, "rows": [row.record() for row in rows], "measurements": measurements}
        write_json(args.json_out, {**result, "passed": not missed})
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
