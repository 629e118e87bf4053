"""The sweep: short benchmarks over presets, architectures and thread counts, as one table.

The hardware guide's advice, measured: on a CPU, more threads help large matmuls and hurt tiny
ones, and the best count depends on the model. Run this before a long run and pick from the table.
"""

from __future__ import annotations

import itertools

from buildllm.config import Config, with_overrides
from buildllm.data.windows import load_windows
from buildllm.measure.breakdown import shares
from buildllm.metrics import json_line, write_metrics
from buildllm.paths import metrics_path
from buildllm.plan.run_plan import announce, apply_plan, make_plan


def sweep(
    config: Config,
    presets: list[str] | None,
    architectures: list[str] | None,
    threads: list[int] | None,
    workers: list[int] | None,
) -> list[dict]:
    from buildllm.measure.benchmark import measure

    rows = []
    # Each knob's values, params.yaml's own where none are given; every combination is one trial.
    axes = {
        "preset": presets or [config.preset],
        "model.architecture": architectures or [config.model.architecture],
        "train.threads": threads or [config.train.threads],
        "train.workers": workers or [config.train.workers],
    }
    trials = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    announce(
        "sweep",
        make_plan(config),
        presets=axes["preset"],
        architectures=axes["model.architecture"],
        threads=axes["train.threads"],
        workers=axes["train.workers"],
        runs=len(trials),
        measured_steps=config.benchmark.measured_steps,
    )
    for trial in trials:
        plan = make_plan(with_overrides(config, trial))
        apply_plan(plan)
        train, validation = load_windows(plan.config, plan.model)
        figures = measure(plan, train, validation, extras=False)
        row = {
            "preset": plan.profile.name,
            "architecture": plan.model.architecture,
            "threads": plan.threads,
            "workers": plan.workers,
            "batch_size": plan.batch_size,
            **{key: figures[key] for key in ("steps_per_second", "tokens_per_second")},
            # The step's time waiting for data: what more workers can win back.
            "data_share": shares(figures).get("data", 0.0),
            # Others' CPU load at the trial's start or end (load.py): its row is then slower than it can be.
            "other_load": max(figures["other_load_start"], figures["other_load_end"]),
            "busy_machine": figures["busy_machine"],
        }
        json_line(**row)
        rows.append(row)
    print(table(rows))
    swept = "{workers}w_" if workers else ""  # the workers count names a row only when it varies
    write_metrics(
        metrics_path("sweep"),
        {
            f"{r['preset']}_{r['architecture']}_{r['threads']}t_" + swept.format(**r) + key: r[key]
            for r in rows
            for key in ("steps_per_second", "tokens_per_second", "data_share", "other_load", "busy_machine")
        },
    )
    return rows


def table(rows: list[dict]) -> str:
    header = (
        f"{'preset':<14}{'architecture':<14}{'threads':>8}{'workers':>8}{'batch':>7}{'steps/s':>10}"
        f"{'tokens/s':>12}{'data wait':>11}{'others':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['preset']:<14}{r['architecture']:<14}{r['threads']:>8}{r['workers']:>8}{r['batch_size']:>7}"
            f"{r['steps_per_second']:>10.2f}{r['tokens_per_second']:>12,.0f}{r['data_share']:>11.1%}"
            f"{r['other_load']:>8.2f}" + ("  busy machine" if r["busy_machine"] else "")
        )
    return "\n".join(lines)
