"""`buildllm compare`: DVC experiments side by side, controls first.

The course: "both runs must use the same model, token files, tokenizer, example limits, batch
size, precision, and epoch count. Compare elapsed time and throughput only after confirming those
controls." So the comparison starts by checking every param and every resolved setting across the
experiments. Device and precision are the variables (plus whatever `--vary` names); any other
difference makes it "not an equal-budget comparison", and speed-ups are withheld unless
`--allow-different` is given.

Experiments come from `dvc exp show --json` (buildllm/report/experiments.py). A run that failed,
or whose metrics contradict its own params (a failed queued run carries its baseline's metrics),
is excluded with one line; its numbers are never reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from buildllm.errors import UserError
from buildllm.paths import metrics_path
from buildllm.report.experiments import PIPELINE, STAGES, Experiment, exp_show, select

VARIABLES = ("device", "precision")
# Settings each stage resolves (a null param becomes a profile's or device's default); two runs
# whose params agree can still differ here, so these are controls as well.
RESOLVED = ("profile", "architecture", "parameters", "n_layer", "n_head", "n_embd", "vocab_size",
            "sequence_length", "batch_size", "grad_accum", "gradient_checkpointing", "compile",
            "measured_steps", "warmup_steps", "planned_tokens")
# param -> resolved metric that must agree with it whenever the param is set explicitly.
MUST_AGREE = {"device": "device", "precision": "precision", "iteration": "iteration",
              "train.batch_size": "batch_size", "train.grad_accum": "grad_accum", "train.threads": "threads",
              "model.sequence_length": "sequence_length", "benchmark.measured_steps": "measured_steps"}
# (column, stage, metric): the figures the report shows, in the CSV's first columns.
SUMMARY = [
    ("tokens_per_second", "benchmark", "tokens_per_second"),
    ("steps_per_second", "benchmark", "steps_per_second"),
    ("throughput_cv", "benchmark", "throughput_cv"),
    ("peak_memory_bytes", "benchmark", "peak_memory_bytes"),
    ("checkpoint_save_seconds", "benchmark", "checkpoint_save_seconds"),
    ("checkpoint_bytes", "benchmark", "checkpoint_bytes"),
    ("time_to_first_step_seconds", "benchmark", "time_to_first_step_seconds"),
    ("mfu", "benchmark", "mfu"),
    ("estimated_seconds", "estimate", "estimated_seconds"),
    ("estimated_seconds_low", "estimate", "estimated_seconds_low"),
    ("estimated_seconds_high", "estimate", "estimated_seconds_high"),
    ("planned_tokens", "estimate", "planned_tokens"),
    ("train_tokens_per_second", "train", "tokens_per_second"),
    ("train_elapsed_seconds", "train", "elapsed_seconds"),
    ("final_validation_loss", "train", "final_validation_loss"),
]
ENVIRONMENT = ("processor", "gpu_name", "gpu_memory_bytes", "memory_total_bytes", "torch_version",
               "torch_cuda_version", "python_version", "platform", "buildllm_version", "threads")


@dataclass
class Comparison:
    experiments: list             # the Experiments compared, first = reference for speed-ups
    excluded: list                # (name, why) for experiments left out
    controls: pd.DataFrame        # one row per control or variable, one column per experiment
    differences: list             # "batch_size 8 vs 4", one per differing control
    vary: list
    allow_different: bool
    frame: pd.DataFrame           # one row per experiment: summary, environment, every param and metric
    notes: list                   # what is missing and therefore not reported
    created: str

    @property
    def equal_budget(self) -> bool:
        return not self.differences

    @property
    def speedups_shown(self) -> bool:
        return self.equal_budget or self.allow_different

    @property
    def verdict(self) -> str:
        variables = ", ".join(VARIABLES + tuple(self.vary))
        if self.equal_budget:
            return (f"Equal-budget comparison: every control matches across {len(self.experiments)} experiments; "
                    f"the variables are {variables}.")
        line = "Not an equal-budget comparison: " + "; ".join(self.differences) + "."
        if self.allow_different:
            return line + (" Speed-ups are shown because --allow-different was given; read them with these "
                           "differences in mind.")
        return line + (" Speed-ups are withheld: rerun with equal controls, name an intended difference with "
                       "--vary KEY, or pass --allow-different.")


def check_runs(experiments: list) -> tuple[list, list]:
    """Keep runs whose metrics are their own; say in one line why each other one is left out."""
    kept, excluded = [], []
    for exp in experiments:
        if exp.state == "failed":
            code = f" (exit code {exp.returncode})" if exp.returncode is not None else ""
            log = f"; its log: {exp.log}" if exp.log else ""
            excluded.append((exp.name, f"the run failed{code}, so the metrics `dvc exp show` lists for it are its "
                                       f"baseline's, not its own; none of its numbers are reported{log}"))
            continue
        if exp.state in ("queued", "running"):
            excluded.append((exp.name, f"the run is {exp.state}, not finished; `dvc queue status` shows progress"))
            continue
        if not exp.metrics:
            why = ("every metrics file in it is its baseline's: no stage ran in it" if exp.carried else
                   "it records no metrics (" + ", ".join(metrics_path(s).as_posix() for s in PIPELINE) + ")")
            excluded.append((exp.name, why + "; run its stages, e.g. `dvc exp run ... benchmark estimate`"))
            continue
        conflict = _contradiction(exp)
        if conflict:
            excluded.append((exp.name, f"{conflict}, so these metrics are not this experiment's (a failed or stale "
                                       f"run); rerun it with `{exp.command}`"))
            continue
        kept.append(exp)
    return kept, excluded


def _contradiction(exp: Experiment) -> str | None:
    for param, key in MUST_AGREE.items():
        wanted = exp.params.get(param)
        if wanted is None or wanted == "auto":
            continue
        for stage, metrics in exp.metrics.items():
            got = metrics.get(key)
            if got is None:
                continue
            same = (str(got).split(":")[0] == str(wanted).split(":")[0]) if key == "device" else _same(got, wanted)
            if not same:
                return f"{metrics_path(stage).as_posix()} says {key} {got} but its params ask for {param}={wanted}"
    return None


def _same(a: Any, b: Any) -> bool:
    def numeric(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if numeric(a) and numeric(b):
        return float(a) == float(b)
    return a == b


def _varied(name: str, vary: list) -> bool:
    leaf = name.split(".")[-1]
    return any(v == name or v.split(".")[-1] == leaf for v in vary)


def controls_table(experiments: list, vary: list) -> tuple[pd.DataFrame, list]:
    """One row per param, resolved setting and data file; which differ, and how, for the verdict."""
    rows = []

    def add(control: str, source: str, values: list) -> None:
        kind = "variable" if control in VARIABLES else "varied" if _varied(control, vary) else "control"
        shown = ["not recorded" if v is None and source != "params" else v for v in values]
        same = all(_same(v, shown[0]) for v in shown[1:])
        rows.append({"control": control, "source": source, "kind": kind, "same": same,
                     **{exp.name: _display(v) for exp, v in zip(experiments, shown)}})

    for key in VARIABLES:
        add(key, "params", [e.params.get(key) for e in experiments])
        add(key, "resolved", [e.metric(key) for e in experiments])
    keys = list(dict.fromkeys(k for e in experiments for k in e.params))
    for key in keys:
        if key not in VARIABLES:
            add(key, "params", [e.params.get(key) for e in experiments])
    for key in RESOLVED:
        # warmup_steps means the benchmark's warm-up only in benchmark.json.
        values = [e.metric(key, ("benchmark",) if key == "warmup_steps" else STAGES) for e in experiments]
        if any(v is not None for v in values):
            add(key, "resolved", values)
    for path in sorted({p for e in experiments for p in e.data}):
        add(path, "data file", [e.data[path][:12] if path in e.data else "not recorded" for e in experiments])
    for v in vary:
        if not any(_varied(r["control"], [v]) for r in rows):
            raise UserError(f"--vary {v}: no param or resolved setting of these experiments is called that; "
                            "name a params.yaml key such as train.threads or train.batch_size")
    table = pd.DataFrame(rows)
    differences, seen = [], set()
    # A resolved value says more than a null param ("batch_size 32 vs 8", not "null vs 8").
    for row in sorted(rows, key=lambda r: r["source"] != "resolved"):
        short = row["control"].split(".")[-1] if row["source"] != "data file" else "data file " + row["control"]
        if row["kind"] == "control" and not row["same"] and short not in seen:
            seen.add(short)
            values = " vs ".join(str(row[e.name]) for e in experiments)
            who = f" ({', '.join(e.name for e in experiments)})" if len(experiments) > 2 else ""
            differences.append(f"{short} {values}{who}")
    return table, differences


def _display(value: Any) -> Any:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return json.dumps(value) if isinstance(value, list) else value


def summary_frame(experiments: list, show_speedups: bool) -> pd.DataFrame:
    records = []
    for exp in experiments:
        record = {"experiment": exp.name, "rev": exp.rev, "baseline": exp.baseline,
                  "baseline_name": exp.baseline_name or "", "date": exp.timestamp or "", "command": exp.command,
                  "device": exp.metric("device"), "precision": exp.metric("precision")}
        record.update({col: exp.metric(key, (stage,)) for col, stage, key in SUMMARY})
        record.update({key: exp.metric(key) for key in ENVIRONMENT})
        record.update({f"param:{k}": _display(v) for k, v in exp.params.items()})
        for stage, metrics in exp.metrics.items():
            record.update({f"{stage}:{k}": v for k, v in metrics.items()})
        records.append(record)
    frame = pd.DataFrame.from_records(records)
    first = frame["tokens_per_second"].iloc[0] if len(frame) else None
    speedup = frame["tokens_per_second"] / first if show_speedups and pd.notna(first) and first else float("nan")
    frame.insert(frame.columns.get_loc("tokens_per_second") + 1, "speedup_vs_first", speedup)
    return frame


NOISY_CV = 0.10  # intervals' throughput varying more than this: the machine was busy or throttling


def caveats(experiments: list) -> list:
    """What the reader must know: noisy measurements, figures a run did not record."""
    notes = [f"{e.name}: throughput varied {e.metric('throughput_cv', ('benchmark',)):.0%} between measured "
             "intervals (the machine was busy or throttling); rerun it on an idle machine before trusting its speed"
             for e in experiments if (e.metric("throughput_cv", ("benchmark",)) or 0) > NOISY_CV]
    for e in experiments:
        if e.carried:
            notes.append(f"{e.name}: " + ", ".join(metrics_path(s).as_posix() for s in e.carried) + " unchanged from "
                         "its baseline (those stages did not run in this experiment), so not reported as its own")
    for stage in ("benchmark", "estimate"):
        lacking = [e.name for e in experiments if stage not in e.metrics]
        if lacking:
            notes.append(f"{metrics_path(stage).as_posix()} is absent in {', '.join(lacking)}: its figures are "
                         f"not reported there (run `dvc exp run ... {stage}` to record them)")
    return notes


def compare(names: list, allow_different: bool = False, vary: list | None = None,
            rows: list | None = None) -> Comparison:
    vary = list(vary or [])
    default_rows = rows if rows is not None else exp_show()
    chosen, notes = select(names, default_rows, rows if rows is not None else (lambda: exp_show(all_commits=True)))
    kept, excluded = check_runs(chosen)
    if len(kept) < 2:
        why = "; ".join(f"{n}: {w}" for n, w in excluded) or "fewer than two experiments were found"
        raise UserError(f"nothing to compare: {len(kept)} usable experiment(s) ({why}); run at least two, e.g. "
                        "`dvc exp run -n cpu-fp32 -S device=cpu -S precision=fp32`")
    table, differences = controls_table(kept, vary)
    created = datetime.now().astimezone().isoformat(timespec="seconds")
    comparison = Comparison(experiments=kept, excluded=excluded, controls=table, differences=differences,
                            vary=vary, allow_different=allow_different, frame=pd.DataFrame(),
                            notes=notes + caveats(kept), created=created)
    comparison.frame = summary_frame(kept, comparison.speedups_shown)
    return comparison


def run_compare(names: list, out: str, allow_different: bool = False, vary: list | None = None) -> Comparison:
    from buildllm.report.render import write_report

    print(json.dumps({"action": "compare", "experiments": names or "workspace and the current baseline's experiments",
                      "out": out, "vary": vary or [], "allow_different": allow_different}), flush=True)
    comparison = compare(names, allow_different, vary)
    for name, why in comparison.excluded:
        print(f"excluded {name}: {why}")
    paths = write_report(comparison, Path(out))
    print(comparison.verdict)
    print("report written: " + ", ".join(str(p) for p in paths))
    return comparison
