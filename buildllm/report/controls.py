"""The controls check of `buildllm compare` (the course's rule and what follows from it: compare.py's
docstring): which runs count, and whether they differ only where they are meant to."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from buildllm.errors import UserError
from buildllm.paths import metrics_path
from buildllm.report.experiments import PIPELINE, STAGES, Experiment

VARIABLES = ("device", "precision")
# Settings each stage resolves (a null param becomes a profile's or device's default); two runs
# whose params agree can still differ here, so these are controls as well.
RESOLVED = (
    "profile",
    "architecture",
    "recipe",
    "optimizer",
    "schedule",
    "learning_rate",
    "parameters",
    "n_layer",
    "n_head",
    "n_embd",
    "vocab_size",
    "sequence_length",
    "batch_size",
    "grad_accum",
    "gradient_checkpointing",
    "compile",
    "measured_steps",
    "warmup_steps",
    "planned_tokens",
)
# param -> resolved metric that must agree with it whenever the param is set explicitly.
MUST_AGREE = {
    "device": "device",
    "precision": "precision",
    "iteration": "iteration",
    "train.batch_size": "batch_size",
    "train.grad_accum": "grad_accum",
    "train.threads": "threads",
    "model.sequence_length": "sequence_length",
    "benchmark.measured_steps": "measured_steps",
}


def check_runs(experiments: list) -> tuple[list, list]:
    """Keep runs whose metrics are their own; say in one line why each other one is left out."""
    reasons = [(exp, _not_its_own(exp)) for exp in experiments]
    return [exp for exp, why in reasons if why is None], [(exp.name, why) for exp, why in reasons if why is not None]


def _not_its_own(exp: Experiment) -> str | None:
    if exp.state == "failed":
        code = f" (exit code {exp.returncode})" if exp.returncode is not None else ""
        log = f"; its log: {exp.log}" if exp.log else ""
        return (
            f"the run failed{code}, so the metrics `dvc exp show` lists for it are its "
            f"baseline's, not its own; none of its numbers are reported{log}"
        )
    if exp.state in ("queued", "running"):
        return f"the run is {exp.state}, not finished; `dvc queue status` shows progress"
    if not exp.metrics:
        why = (
            "every metrics file in it is its baseline's: no stage ran in it"
            if exp.carried
            else "it records no metrics (" + ", ".join(metrics_path(s).as_posix() for s in PIPELINE) + ")"
        )
        return why + "; run its stages, e.g. `dvc exp run ... benchmark estimate`"
    for param, key in MUST_AGREE.items():
        wanted = exp.params.get(param)
        if wanted is None or wanted == "auto":
            continue
        for stage, metrics in exp.metrics.items():
            got = metrics.get(key)
            if got is None:
                continue
            same = (str(got).split(":")[0] == str(wanted).split(":")[0]) if key == "device" else got == wanted
            if not same:
                return (
                    f"{metrics_path(stage).as_posix()} says {key} {got} but its params ask for {param}={wanted}, "
                    f"so these metrics are not this experiment's (a failed or stale run); rerun it with "
                    f"`{exp.command}`"
                )
    return None


def _varied(name: str, vary: list) -> bool:
    return any(v.split(".")[-1] == name.split(".")[-1] for v in vary)


def controls_table(experiments: list, vary: list) -> tuple[pd.DataFrame, list]:
    """One row per param, resolved setting and data file; which differ, and how, for the verdict."""
    rows = []

    # A metrics folder without params.yaml (or without dvc.lock) records no params (or data hashes):
    # those cells say so and the row is checked across the experiments that record them.
    params_known = [e.params_recorded for e in experiments]
    data_known = [e.source != "folder" or bool(e.data) for e in experiments]

    def add(control: str, source: str, values: list, known: list | None = None) -> None:
        kind = "variable" if control in VARIABLES else "varied" if _varied(control, vary) else "control"
        known = known or [True] * len(values)
        shown = [v if k else "not recorded" for v, k in zip(values, known)]
        shown = ["not recorded" if v is None and source != "params" else v for v in shown]
        compared = [v for v, k in zip(shown, known) if k]
        same = all(v == compared[0] for v in compared[1:])
        rows.append(
            {
                "control": control,
                "source": source,
                "kind": kind,
                "same": same,
                "checked": sum(known),
                **{exp.name: display(v) for exp, v in zip(experiments, shown)},
            }
        )

    for key in VARIABLES:
        add(key, "params", [e.params.get(key) for e in experiments], params_known)
        add(key, "resolved", [e.metric(key) for e in experiments])
    for key in dict.fromkeys(k for e in experiments for k in e.params):
        if key not in VARIABLES:
            add(key, "params", [e.params.get(key) for e in experiments], params_known)
    for key in RESOLVED:
        # warmup_steps means the benchmark's warm-up only in benchmark.json.
        values = [e.metric(key, ("benchmark",) if key == "warmup_steps" else STAGES) for e in experiments]
        if any(v is not None for v in values):
            add(key, "resolved", values)
    for path in sorted({p for e in experiments for p in e.data}):
        add(
            path,
            "data file",
            [e.data[path][:12] if path in e.data else "not recorded" for e in experiments],
            data_known,
        )
    for v in vary:
        if not any(_varied(r["control"], [v]) for r in rows):
            raise UserError(
                f"--vary {v}: no param or resolved setting of these experiments is called that; "
                "name a params.yaml key such as train.threads or train.batch_size"
            )
    differences = {}  # one per control, under its short name
    # A resolved value says more than a null param ("batch_size 32 vs 8", not "null vs 8").
    for row in sorted(rows, key=lambda r: r["source"] != "resolved"):
        short = row["control"].split(".")[-1] if row["source"] != "data file" else "data file " + row["control"]
        if row["kind"] == "control" and not row["same"] and short not in differences:
            values = " vs ".join(str(row[e.name]) for e in experiments)
            who = f" ({', '.join(e.name for e in experiments)})" if len(experiments) > 2 else ""
            differences[short] = f"{short} {values}{who}"
    return pd.DataFrame(rows), list(differences.values())


def display(value: Any) -> Any:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return json.dumps(value) if isinstance(value, list) else value
