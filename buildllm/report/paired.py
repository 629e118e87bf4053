"""`buildllm compare A B --paired`: re-measure the experiments' benchmarks interleaved, on this machine.

One benchmark per side says little on a busy machine: a competing job that slows one whole run
and not the other makes a speed-up out of nothing. Paired mode reruns each experiment's bounded
benchmark (its own params, so its own warm-up, steps and intervals) in rounds, each run in a fresh
`python -m buildllm benchmark` process; within a round the order alternates (A B, then B A, ...)
so a machine that slows down or speeds up over time hits both sides equally. Each round gives one
ratio per experiment against the first; the speed-up is their median, with the sign-test interval
(buildllm/report/uncertainty.py).

Each process runs in its own temporary folder holding the experiment's params.yaml and links to
the project's other entries (data/, tokenizer/, ...), so it reads the same token files and writes
its metrics there: the workspace's metrics/ stays untouched.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from buildllm.errors import UserError
from buildllm.measure.workfolder import prepare, read_result, run_command
from buildllm.report.uncertainty import from_pairs


@dataclass
class Paired:
    names: list  # the experiments, first = reference
    rounds: list = field(default_factory=list)  # one {name: benchmark metrics} per round
    orders: list = field(default_factory=list)  # the order each round ran in

    def tokens_per_second(self, name: str) -> list:
        return [r[name]["tokens_per_second"] for r in self.rounds]

    def ratios(self, name: str) -> list:
        ref = self.names[0]
        return [r[name]["tokens_per_second"] / r[ref]["tokens_per_second"] for r in self.rounds]

    def speedups(self) -> dict:
        return {name: from_pairs(self.ratios(name)) for name in self.names[1:]}

    def median_cv(self, name: str) -> float:
        return statistics.median(r[name].get("throughput_cv", 0.0) for r in self.rounds)


def _run_one(folder: Path, name: str, round_number: int, timeout: float) -> dict:
    result_file = folder / "metrics" / "benchmark.json"
    result_file.unlink(missing_ok=True)
    try:
        done = run_command(folder, ["benchmark"], timeout)
    except subprocess.TimeoutExpired:
        raise UserError(
            f"--paired: the benchmark of {name} (round {round_number}) ran over {timeout:.0f} s; "
            "bound it with fewer benchmark.measured_steps in that experiment"
        ) from None
    if done.returncode != 0 or not result_file.is_file():
        raise UserError(
            f"--paired: the benchmark of {name} (round {round_number}) failed here "
            f"({done.last_line()}); run `buildllm benchmark` with that experiment's params to see why"
        )
    return read_result(folder, "benchmark")


def remeasure(
    experiments: list, rounds: int, root: Path | None = None, progress: bool = True, timeout: float = 1800
) -> Paired:
    """Rerun each experiment's benchmark `rounds` times, interleaved, each in a fresh process."""
    if rounds < 1:
        raise UserError(f"--rounds {rounds}: give at least 1 (6 or more for a 95% interval)")
    for exp in experiments:
        if exp.source != "dvc" or not exp.params_recorded:
            raise UserError(
                f"--paired re-measures on this machine from each experiment's params; {exp.name} is a "
                "metrics folder (measured elsewhere), so it cannot be rerun here: drop --paired"
            )
    root = Path(root or Path.cwd())
    paired = Paired(names=[e.name for e in experiments])
    print(
        json.dumps(
            {
                "action": "paired benchmarks",
                "experiments": paired.names,
                "rounds": rounds,
                "processes": rounds * len(experiments),
            }
        ),
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="buildllm-paired-") as tmp:
        folders = {}
        for i, exp in enumerate(experiments):
            folders[exp.name] = Path(tmp) / f"run{i}"
            prepare(folders[exp.name], exp.params, root)
        with tqdm(total=rounds * len(experiments), desc="paired", unit="run", disable=not progress) as bar:
            for r in range(rounds):
                order = experiments if r % 2 == 0 else experiments[::-1]
                measured = {}
                for exp in order:
                    bar.set_postfix_str(f"round {r + 1}: {exp.name}")
                    measured[exp.name] = _run_one(folders[exp.name], exp.name, r + 1, timeout)
                    bar.update()
                paired.rounds.append(measured)
                paired.orders.append([e.name for e in order])
    return paired
