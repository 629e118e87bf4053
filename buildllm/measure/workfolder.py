"""A `buildllm` command run as a user runs it, a fresh `python -m buildllm` process of this very
package in a folder of its own: for every check that measures by running the product (the paired
comparison, `buildllm verify estimate | mfu`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from tqdm import tqdm

import buildllm
from buildllm.config import Config, config_to_dict
from buildllm.errors import UserError
from buildllm.knob import set_dotted
from buildllm.measure.stats import Paired
from buildllm.metrics import json_line

KEEP_OUT = {"metrics", "params.yaml"}  # each run's own, never the project's


def last_line(done: subprocess.CompletedProcess) -> str:
    return (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]


def prepare(folder: Path, params: dict | Config) -> Path:
    """Make `folder` with `params` (flat dotted keys, nested, or a validated Config) as its params.yaml,
    linking every entry of the working directory (the project) but its metrics and params: the command
    reads the same token files and writes nothing into the project (a Config's checkpoints too)."""
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(params, Config):
        params = {**config_to_dict(params), "train.checkpoint_directory": str(folder.resolve() / "checkpoints")}
    tree: dict = {}
    for dotted, value in params.items():
        set_dotted(tree, dotted, value)
    (folder / "params.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    for entry in Path.cwd().iterdir():
        link = folder / entry.name
        if entry.name not in KEEP_OUT and not link.exists():
            link.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    return folder


def run_command(
    folder: Path, arguments: list[str], timeout: float | None = None, module: str = "buildllm"
) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m <module> <arguments> --params params.yaml` in `folder`, and its wall clock, interpreter
    start included; raises subprocess.TimeoutExpired."""
    env = dict(os.environ)
    package_root = str(Path(buildllm.__file__).resolve().parents[1])  # this very code, in the child too
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    begin = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", module, *arguments, "--params", "params.yaml"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done, time.perf_counter() - begin


def run_step(folder: Path, command: str, who: str, timeout: float | None = None) -> float:
    """`buildllm <command>` in `folder`, its seconds; when it does not finish, one line on why, naming `who` ran it."""
    try:
        done, seconds = run_command(folder, [command], timeout)
    except subprocess.TimeoutExpired:
        raise UserError(
            f"{who}: `buildllm {command}` ran over {timeout:.0f} s; bound it with fewer benchmark.measured_steps"
        ) from None
    if done.returncode != 0:
        raise UserError(
            f"{who}: `buildllm {command}` failed ({last_line(done)}); run it with the same params to see why"
        )
    return seconds


def run_benchmark(folder: Path, who: str, timeout: float) -> dict:
    """A fresh `buildllm benchmark` in `folder`: the metrics it wrote (an earlier round's go first)."""
    result = folder / "metrics" / "benchmark.json"
    result.unlink(missing_ok=True)
    run_step(folder, "benchmark", who, timeout)
    return json.loads(result.read_text())


def remeasure(experiments: list, rounds: int, timeout: float = 1800) -> Paired:
    """`buildllm compare A B --paired`: one benchmark per side says little on a busy machine, so each
    experiment's benchmark is rerun `rounds` times, each in a fresh process, the order alternating
    (A B, then B A, ...) so a machine that slows down or speeds up hits both sides equally."""
    if rounds < 1:
        raise UserError(f"--rounds {rounds}: give at least 1 (6 or more for a 95% interval)")
    for exp in experiments:
        if exp.source != "dvc" or not exp.params_recorded:
            raise UserError(
                f"--paired re-measures on this machine from each experiment's params; {exp.name} is a "
                "metrics folder (measured elsewhere), so it cannot be rerun here: drop --paired"
            )
    paired = Paired(names=[e.name for e in experiments])
    json_line(action="paired benchmarks", experiments=paired.names, rounds=rounds, processes=rounds * len(experiments))
    with tempfile.TemporaryDirectory(prefix="buildllm-paired-") as tmp:
        folders = {exp.name: prepare(Path(tmp) / f"run{i}", exp.params) for i, exp in enumerate(experiments)}
        with tqdm(total=rounds * len(experiments), desc="paired", unit="run") as bar:
            for r in range(rounds):
                order = experiments if r % 2 == 0 else experiments[::-1]
                measured = {}
                for exp in order:
                    bar.set_postfix_str(f"round {r + 1}: {exp.name}")
                    measured[exp.name] = run_benchmark(
                        folders[exp.name], f"--paired, {exp.name}, round {r + 1}", timeout
                    )
                    bar.update()
                paired.rounds.append(measured)
                paired.orders.append([e.name for e in order])
    return paired
