"""The sweep: short benchmarks over presets, architectures and thread counts, as one table.

The hardware guide's advice, measured: on a CPU, more threads help large matmuls and hurt tiny
ones, and the best count depends on the model. Run this before a long run and pick from the table.
"""

from __future__ import annotations

import itertools
import json

from buildllm.config import Config, with_overrides
from buildllm.data.windows import load_windows
from buildllm.metrics import write_metrics
from buildllm.paths import metrics_path
from buildllm.plan import announce, apply_plan, make_plan

COLUMNS = ("preset", "architecture", "threads", "batch_size", "steps_per_second", "tokens_per_second")


def sweep(config: Config, presets: list[str] | None, architectures: list[str] | None,
          threads: list[int] | None, write: bool = True) -> list[dict]:
    from buildllm.measure.benchmark import measure

    rows = []
    axes = (presets or [config.preset], architectures or [config.model.architecture], threads or [config.train.threads])
    announce("sweep", make_plan(config), presets=axes[0], architectures=axes[1], threads=axes[2],
             runs=len(list(itertools.product(*axes))), measured_steps=config.benchmark.measured_steps)
    for preset, architecture, thread_count in itertools.product(*axes):
        trial = with_overrides(config, {"preset": preset, "model.architecture": architecture,
                                        "train.threads": thread_count})
        plan = make_plan(trial)
        apply_plan(plan)
        train, validation = load_windows(plan.config, plan.model)
        figures = measure(plan, train, validation, extras=False, progress=False)
        row = {"preset": plan.profile.name, "architecture": plan.model.architecture, "threads": plan.threads,
               "batch_size": plan.batch_size, "steps_per_second": figures["steps_per_second"],
               "tokens_per_second": figures["tokens_per_second"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(table(rows))
    if write:
        write_metrics(metrics_path("sweep"), {f"{r['preset']}_{r['architecture']}_{r['threads']}t_{key}": r[key]
                                              for r in rows for key in ("steps_per_second", "tokens_per_second")})
    return rows


def table(rows: list[dict]) -> str:
    header = f"{'preset':<14}{'architecture':<14}{'threads':>8}{'batch':>7}{'steps/s':>10}{'tokens/s':>12}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['preset']:<14}{r['architecture']:<14}{r['threads']:>8}{r['batch_size']:>7}"
                     f"{r['steps_per_second']:>10.2f}{r['tokens_per_second']:>12,.0f}")
    return "\n".join(lines)
