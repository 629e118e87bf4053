"""`buildllm verify speed`: the product's training step against a bare one on the same model, batch and precision.

The bare step (verify/bare_step.py) is the step written plainly: forward, loss, backward, clipping,
the recipe's optimizer (fused AdamW, with Muon under the muon recipe), zero_grad, on batches put on
the device before anything is timed. The product's step is Trainer.step() as a run takes it: its
data cursor builds and delivers every batch, the schedule sets the learning rate, autocast and the
gradient scaler wrap it. Both live in this one process and take turns (bare then product, then
product then bare, and so on), each turn --steps steps timed after the device's queue has drained
(Device.timed), after --warmup untimed turns each; each round's product ÷ bare is one pair. The
overhead is the pairs' median less 1, with the sign test's interval (measure/stats.py).

The verdict: a miss (exit 1) when the interval's low end is above --limit (3%): the product is then
shown, at the interval's confidence, to be more than 3% slower. A median above 3% whose interval
reaches below it is reported as not settled (exit 0): on a shared machine a single slow turn moves a
median of few pairs more than 3%, and a check that failed on noise would be rerun until it passed.
More --rounds narrow the interval.
"""

from __future__ import annotations

import statistics
import tempfile

from buildllm.config import load_config
from buildllm.errors import UserError
from buildllm.verify.harness import add_plan_arguments, finish, machine, plan_overrides

LIMIT = 0.03


def add_arguments(parser) -> None:
    add_plan_arguments(parser)
    parser.add_argument("--batch-size", type=int, metavar="N")
    parser.add_argument("--rounds", type=int, default=20, metavar="N", help="timed rounds, a pair each (default 20)")
    parser.add_argument("--steps", type=int, default=3, metavar="N", help="optimizer steps per turn (default 3)")
    parser.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed turns of each side (default 2)")
    parser.add_argument(
        "--limit",
        type=float,
        default=LIMIT,
        metavar="F",
        help=f"the product's overhead allowed, product ÷ bare - 1 (default {LIMIT}); a miss when the "
        "interval's low end is above it",
    )


def command(args) -> int:
    for name, least in (("rounds", 2), ("steps", 1), ("warmup", 0)):
        if getattr(args, name) < least:
            raise UserError(f"--{name} {getattr(args, name)}: give at least {least}")
    if args.limit <= -1:
        raise UserError(f"--limit {args.limit}: an overhead is above -1 (the product takes some time); give e.g. 0.03")
    config = load_config(args.params, plan_overrides(args, {"train.batch_size": args.batch_size}))
    from buildllm.data.windows import windows_or_random
    from buildllm.measure.stats import from_pairs
    from buildllm.plan.run_plan import apply_plan, make_plan
    from buildllm.train.trainer import Trainer
    from buildllm.verify.bare_step import bare_step

    plan = make_plan(config)
    apply_plan(plan)
    train, _, source = windows_or_random(config, plan.model, plan.batch_size)
    device, steps = plan.device, args.steps
    print(
        f"verify speed: {plan.profile.name} on {device.device} ({plan.precision.precision}), batch "
        f"{plan.batch_size} x {plan.model.sequence_length}, {plan.threads} threads, {source} tokens; "
        f"{args.rounds} rounds of {steps} steps each side, taking turns, after {args.warmup} warm-up turns",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="buildllm-verify-speed-") as scratch:
        trainer = Trainer(plan, train, None, directory=scratch)  # never saves: the folder only satisfies it
        bare = bare_step(plan, train)

        turns = {"bare": bare, "product": trainer.step}
        for name in [*turns] * args.warmup:
            turns[name]()
        seconds = {name: [] for name in turns}
        for number in range(args.rounds):
            # Bare first in odd rounds, product first in even ones: a side that gained from going
            # first (or second) would gain in half the pairs only.
            for name in [*turns] if number % 2 == 0 else [*turns][::-1]:
                begin = device.timed()
                for _ in range(steps):
                    turns[name]()
                seconds[name].append(device.timed() - begin)
        del trainer, bare
    ratios = [product / bare for bare, product in zip(seconds["bare"], seconds["product"])]
    for number, (b, p, r) in enumerate(zip(seconds["bare"], seconds["product"], ratios), start=1):
        per_step = f"bare {b / steps * 1e3:8.1f} ms/step  product {p / steps * 1e3:8.1f} ms/step"
        print(f"round {number:>3}: {per_step}  {r - 1:+.1%}")
    figure = from_pairs(ratios)
    overhead, low, high = figure.estimate - 1, figure.low - 1, figure.high - 1
    missed, settled = low > args.limit, high <= args.limit or low > args.limit
    verdict = "MISSED: shown above" if missed else "inside" if settled else "not settled: the interval straddles"
    print(
        f"product's step over the bare step: {overhead:+.1%} ({figure.level} interval {low:+.1%} to {high:+.1%}, "
        f"sign test over {len(ratios)} rounds); limit {args.limit:+.0%}: {verdict} the limit"
        + ("" if settled else f"; rerun with more --rounds than {len(ratios)}"),
        flush=True,
    )
    record = {
        "profile": plan.profile.name,
        "device": device.device,
        "precision": plan.precision.precision,
        "batch_size": plan.batch_size,
        "sequence_length": plan.model.sequence_length,
        "threads": plan.threads,
        "compile": plan.compile.enabled,
        "tokens": source,
        "rounds": len(ratios),
        "steps_per_turn": steps,
        "warmup_turns": args.warmup,
        "bare_seconds_per_step": statistics.median(seconds["bare"]) / steps,
        "product_seconds_per_step": statistics.median(seconds["product"]) / steps,
        "overhead": overhead,
        "overhead_low": low,
        "overhead_high": high,
        "coverage": round(figure.coverage, 4),
        "limit": args.limit,
        "settled": settled,
        **machine(),
    }
    return finish("speed", args.out, record, int(missed), 1)
