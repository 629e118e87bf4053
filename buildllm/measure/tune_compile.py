"""torch.compile's cost and gain for one plan, measured in a fresh process within a deadline.

A compilation cannot be stopped half-way inside a process, so `buildllm tune` runs it in a child
that it ends when the budget runs out (the record then says so). The child times a plain and a
compiled Trainer's first steps (compile seconds = the compiled one's warm-up minus the plain one's),
then lets them take turns (A B A B, measure/stats.py) and prints its figures as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from buildllm.config import Config, config_to_dict, load_config, with_overrides
from buildllm.data.windows import windows_or_random
from buildllm.measure.stats import compare, interleave
from buildllm.measure.workfolder import last_line, run_command
from buildllm.metrics import json_line
from buildllm.plan.run_plan import apply_plan, make_plan
from buildllm.train.trainer import Trainer

WARMUP_STEPS = 2
ROUNDS = 12  # pairs of turns at most: enough for a 95% interval of the median ratio


def measure_compile(config: Config, settings: dict, record: dict, seconds: float) -> dict:
    """The child's figures, or {"skipped": why} when it failed or did not finish within `seconds`. The
    child plans from `record`, the tune record being written (run_plan.make_plan's tune_record): it runs
    the attention and loss chunk this tune measured, not the last tune's on disk."""
    # Leave a little of the window for the child's last round and its exit.
    deadline = time.time() + max(seconds - 3.0, 1.0)
    # The child works in this folder (its params and its trainers' scratch), which goes with it.
    with tempfile.TemporaryDirectory(prefix="buildllm-tune-compile-") as folder:
        (Path(folder) / "params.yaml").write_text(yaml.safe_dump(config_to_dict(config)))
        try:
            done, _ = run_command(
                Path(folder),
                [json.dumps(settings), json.dumps(record), str(deadline)],
                seconds,
                "buildllm.measure.tune_compile",
            )
        except subprocess.TimeoutExpired:
            return {
                "skipped": f"skipped: did not finish compiling and timing within the {seconds:.0f} s left "
                "of tune.seconds (raise it to measure torch.compile)"
            }
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return {"skipped": f"failed here ({last_line(done)[:200]}): not compiling"}
    return json.loads(lines[-1])


def child(params: str, settings: dict, record: dict, deadline: float) -> dict:
    config = load_config(params)
    plans = {
        name: make_plan(with_overrides(config, {**settings, "train.compile": compile_knob}), tune_record=record)
        for name, compile_knob in (("plain", "false"), ("compiled", "true"))
    }
    apply_plan(plans["plain"])
    device = plans["plain"].device
    train, validation, _ = windows_or_random(config, plans["plain"].model, plans["plain"].batch_size)
    scratch = Path.cwd() / "scratch"  # in the parent's temporary folder, the child's cwd
    trainers = {name: Trainer(plan, train, validation, directory=scratch) for name, plan in plans.items()}
    warmup = {}
    for name, trainer in trainers.items():
        begin = device.timed()
        for _ in range(WARMUP_STEPS):
            trainer.step()
        warmup[name] = device.timed() - begin
    end = time.perf_counter() + (deadline - time.time())
    seconds = interleave(
        {name: trainer.step for name, trainer in trainers.items()},
        warmup=0,
        rounds=ROUNDS,
        soft_deadline=end,
        hard_deadline=end,
        min_rounds=3,
        clock=device.timed,
    )
    figures = compare(seconds, "plain")["compiled"]
    return {
        "compile_seconds": warmup["compiled"] - warmup["plain"],
        "speedup": figures["ratio"],
        **{key: figures[key] for key in ("low", "high", "pairs", "coverage")},
        "plain_step_seconds": figures["reference_median_seconds"],
        "compiled_step_seconds": figures["median_seconds"],
        "precision": plans["plain"].precision.precision,
        "attention": plans["plain"].attention.kernel,
    }


if __name__ == "__main__":
    settings, record, deadline, _, params = sys.argv[1:]  # as workfolder.run_command passes them
    json_line(**child(params, json.loads(settings), json.loads(record), float(deadline)))
