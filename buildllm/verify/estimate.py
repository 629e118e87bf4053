"""`buildllm verify estimate`: benchmark -> estimate -> a real training run, and where the run's time
fell against the estimate's range.

Each command runs as the user runs it, a fresh process in a folder of its own
(buildllm/measure/workfolder.py), and the run is judged as its own metrics record it
(buildllm/train/against_estimate.py).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from buildllm.config import load_config
from buildllm.errors import UserError
from buildllm.verify.harness import add_plan_arguments, finish, machine, plan_overrides


def add_arguments(parser) -> None:
    parser.add_argument(
        "--full",
        action="store_true",
        help="the planned run itself (params.yaml's benchmark and training size), not a bounded one",
    )
    add_plan_arguments(parser)
    parser.add_argument("--batch-size", type=int, metavar="N")
    parser.add_argument(
        "--factor",
        type=int,
        default=10,
        metavar="N",
        help="bounded form: training steps = N x the benchmark's steps (default 10)",
    )
    parser.add_argument("--warmup-steps", type=int, default=3, metavar="N", help="bounded form's benchmark (default 3)")
    parser.add_argument("--measured-steps", type=int, default=20, metavar="N", help="bounded form's (default 20)")
    parser.add_argument("--intervals", type=int, default=4, metavar="N", help="bounded form's (default 4)")
    parser.add_argument("--keep", metavar="DIR", help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument(
        "--recorded",
        action="store_true",
        help="judge the run recorded here (metrics/estimate.json, metrics/train.json); run nothing",
    )


def planned(args):
    from buildllm.plan.run_plan import make_plan

    chosen = plan_overrides(args, {"train.batch_size": args.batch_size, "train.resume": False})
    if args.full:
        return load_config(args.params, chosen)
    if args.factor < 1:
        raise UserError(f"--factor {args.factor}: give at least 1 (training steps = factor x benchmark steps)")
    chosen.update({f"benchmark.{key}": getattr(args, key) for key in ("warmup_steps", "measured_steps", "intervals")})
    config = load_config(args.params, chosen)
    steps = args.factor * (config.benchmark.warmup_steps + config.benchmark.measured_steps)
    examples = steps * make_plan(config).batch_size * config.train.grad_accum
    return load_config(args.params, {**chosen, "train.training_examples": examples})


def judge(folder: Path, wall: float | None) -> tuple[dict, bool]:
    """(the record's figures, whether the run fell inside the range) from a folder's metrics files."""
    from buildllm.metrics import read_metrics
    from buildllm.train.against_estimate import describe, position, same_plan

    metrics = Path(folder) / "metrics"
    est, trained = read_metrics(metrics / "estimate.json"), read_metrics(metrics / "train.json")
    if not same_plan(est, trained):
        raise UserError(
            f"{metrics / 'estimate.json'} estimated another plan than {metrics / 'train.json'} ran; "
            "run `buildllm estimate` and `buildllm train` with the same params, then check again"
        )
    if trained.get("status") != "completed" or trained.get("resumed"):
        raise UserError(
            f"{metrics / 'train.json'} records a {trained.get('status')} run"
            f"{' that resumed' if trained.get('resumed') else ''}; the estimate projects one whole run"
        )
    if "run_seconds" not in trained:
        raise UserError(f"{metrics / 'train.json'} has no run_seconds (written by an older buildllm); train again")
    # The recorded position is recomputed from the files, so an estimate edited afterwards is judged as it is now.
    figures = position(est, trained["run_seconds"])
    steps_error = est["estimated_seconds_by_steps"] / trained["train_seconds"] - 1
    print(
        f"\n{trained['profile']} on {trained['device']} ({trained['precision']}, batch {trained['batch_size']}, "
        f"{trained.get('threads', '?')} threads): {trained['optimizer_steps']} optimizer steps"
    )
    print(f"{'':<34}{'predicted':>11}{'actual':>11}{'error':>9}")
    run_error = figures["estimate_ratio"] - 1
    for label, predicted, actual, error in (
        ("optimizer steps (step time only)", est["estimated_seconds_by_steps"], trained["train_seconds"], steps_error),
        ("train command, wall clock", figures["estimated_seconds"], figures["run_seconds"], run_error),
    ):
        print(f"{label:<34}{predicted:>10.1f}s{actual:>10.1f}s{error:>+9.1%}")
    if wall:
        print(f"(the train command took {wall:.1f} s as its caller saw it, interpreter exit included)")
    print(
        f"the run {describe(figures)}; the range allows {est.get('run_to_run_spread', 0.0):.0%} run-to-run "
        f"variation beyond the benchmark's intervals",
        flush=True,
    )
    record = {
        **figures,
        **{key: trained[key] for key in ("profile", "device", "precision")},
        "planned_steps": trained["optimizer_steps"],
        "estimated_step_seconds": est["estimated_seconds_by_steps"],
        "train_seconds": trained["train_seconds"],
        "step_error": steps_error,
        "run_to_run_spread": est.get("run_to_run_spread", 0.0),
    }
    return record, figures["estimate_position"] == "inside"


def command(args) -> int:
    base = {"full": args.full, "recorded": args.recorded, **machine()}
    if args.recorded:
        record, inside = judge(Path(), None)
    else:
        from buildllm.measure.workfolder import prepare, run_step
        from buildllm.metrics import json_line

        folder = Path(args.keep or tempfile.mkdtemp(prefix="buildllm-verify-estimate-")).resolve()
        prepare(folder, planned(args))
        for step in ("benchmark", "estimate", "train"):  # wall: at the end, the train command's, as seen here
            json_line(action=f"verify estimate: buildllm {step}", folder=str(folder))
            wall = run_step(folder, step, "verify estimate")
        record, inside = judge(folder, wall)
        record["train_command_seconds"] = wall
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return finish("estimate", args.out, {**base, **record}, 0 if inside else 1, 1)
