"""`buildllm compare`: DVC experiments side by side, controls first.

The course: "both runs must use the same model, token files, tokenizer, example limits, batch
size, precision, and epoch count. Compare elapsed time and throughput only after confirming those
controls." So device and precision are the variables (plus whatever `--vary` names); any other
difference in a param or resolved setting (controls.py) makes it "not an equal-budget comparison",
and speed-ups are withheld unless `--allow-different` is given. A run that failed, or whose metrics
contradict its own params, is excluded with one line; its numbers are never reported. A speed-up's
interval comes from the runs' measured intervals, or with --paired from re-measuring them
interleaved here (buildllm/measure/stats.py); one that includes 1.0, or that rests on a run noisier
than NOISY_CV, is inconclusive.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime

import pandas as pd

from buildllm.device.load import BUSY_SHARE
from buildllm.errors import UserError
from buildllm.measure.stats import NOISY_CV, Paired, from_intervals, is_noisy
from buildllm.measure.workfolder import remeasure
from buildllm.paths import metrics_path
from buildllm.report.controls import VARIABLES, check_runs, controls_table, display
from buildllm.report.curves import loss_key, read_curves, target_loss
from buildllm.report.experiments import Experiment, select

# (column, stage, metric): the figures the report shows, in the CSV's first columns.
SUMMARY = [
    ("tokens_per_second", "benchmark", "tokens_per_second"),
    ("steps_per_second", "benchmark", "steps_per_second"),
    ("throughput_cv", "benchmark", "throughput_cv"),
    # Other processes' CPU load when the benchmark started and ended (device/load.py).
    ("busy_machine", "benchmark", "busy_machine"),
    ("other_load_start", "benchmark", "other_load_start"),
    ("other_load_end", "benchmark", "other_load_end"),
    ("peak_memory_bytes", "benchmark", "peak_memory_bytes"),
    ("checkpoint_save_seconds", "benchmark", "checkpoint_save_seconds"),
    ("checkpoint_bytes", "benchmark", "checkpoint_bytes"),
    ("time_to_first_step_seconds", "benchmark", "time_to_first_step_seconds"),
    ("mfu", "benchmark", "mfu"),
    # Where a step's time goes (buildllm/measure/breakdown.py): the chart's stacked bar.
    ("step_data_seconds", "benchmark", "step_data_seconds"),
    ("step_transfer_seconds", "benchmark", "step_transfer_seconds"),
    ("step_compute_seconds", "benchmark", "step_compute_seconds"),
    ("step_optimizer_seconds", "benchmark", "step_optimizer_seconds"),
    ("step_validation_seconds", "benchmark", "step_validation_seconds"),
    ("step_checkpoint_seconds", "benchmark", "step_checkpoint_seconds"),
    ("estimated_seconds", "estimate", "estimated_seconds"),
    ("estimated_seconds_low", "estimate", "estimated_seconds_low"),
    ("estimated_seconds_high", "estimate", "estimated_seconds_high"),
    ("planned_tokens", "estimate", "planned_tokens"),
    ("train_tokens_per_second", "train", "tokens_per_second"),
    ("train_elapsed_seconds", "train", "elapsed_seconds"),
    ("final_validation_loss", "train", "final_validation_loss"),
    ("final_validation_bits_per_byte", "train", "final_validation_bits_per_byte"),
]
ENVIRONMENT = (
    "processor",
    "gpu_name",
    "gpu_memory_bytes",
    "memory_total_bytes",
    "torch_version",
    "torch_cuda_version",
    "python_version",
    "platform",
    "buildllm_version",
    "threads",
)


@dataclass
class Comparison:
    experiments: list  # the Experiments compared, first = reference for speed-ups
    excluded: list  # (name, why) for experiments left out
    controls: pd.DataFrame  # one row per control or variable, one column per experiment
    differences: list  # "batch_size 8 vs 4", one per differing control
    vary: list
    allow_different: bool
    notes: list  # what is missing and therefore not reported
    created: str
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)  # per experiment: summary, environment, params, metrics
    speedups: dict = field(default_factory=dict)  # name -> Speedup vs the first experiment
    paired: Paired | None = None  # the interleaved re-measurements, with --paired
    curves: dict = field(default_factory=dict)  # name -> training log rows (buildllm/report/curves.py)
    target_loss: float | None = None  # the validation loss every run reached, in loss_key's unit
    loss_key: str = "validation_loss"  # the log's column the target is in: bits per byte where all have it

    @property
    def equal_budget(self) -> bool:
        return not self.differences

    @property
    def speedups_shown(self) -> bool:
        return self.equal_budget or self.allow_different

    @property
    def reference(self) -> str:
        return self.experiments[0].name

    def noise(self, name: str) -> float | None:
        """The interval CV a speed-up involving `name` rests on (with --paired: the median of its rounds')."""
        if self.paired is not None:
            return self.paired.median_cv(name)
        return next(e for e in self.experiments if e.name == name).metric("throughput_cv", ("benchmark",))

    @property
    def noisy(self) -> list:
        return [(e.name, cv) for e in self.experiments if is_noisy(cv := self.noise(e.name))]

    def inconclusive(self, name: str) -> str | None:
        """Why the speed-up of `name` is not a result, or None when it is one."""
        s = self.speedups[name]
        if not s.has_interval:
            return f"it has no interval ({s.method})"
        if s.coverage < 0.95:
            return f"{s.pairs} rounds give only a {s.level} interval; use --rounds 6 or more for 95%"
        if self.paired is None:
            loud = [(n, cv) for n, cv in self.noisy if n in (self.reference, name)]
            if loud:
                return (
                    "; ".join(f"{n}'s throughput varied {cv:.0%} between intervals" for n, cv in loud)
                    + f", over the {NOISY_CV:.0%} noise threshold (rerun on an idle machine, or compare with "
                    "--paired)"
                )
            crowded = [e.name for e in self.experiments if e.name in (self.reference, name) and busy(e)]
            if crowded:
                return (
                    f"{' and '.join(crowded)} measured on a busy machine (other processes took its cores); "
                    "rerun on an idle machine, or compare with --paired"
                )
        if s.includes_one:
            return "the interval includes 1.0 (no change)"
        return None

    def speedup_line(self, name: str) -> str:
        s, why = self.speedups[name], self.inconclusive(name)
        if why:
            return f"{name} vs {self.reference}: inconclusive, {s.text()}: {why}."
        busy = ""
        if self.paired is not None and is_noisy(self.noise(name)):
            busy = (
                f" The machine was busy (median interval CV {self.noise(name):.0%}); the pairing cancels drift "
                "between runs, not within them."
            )
        return f"{name} vs {self.reference}: {s.text()}.{busy}"

    @property
    def tone(self) -> str:
        """ok (green) only for an equal budget with quiet runs and conclusive speed-ups."""
        if not self.equal_budget:
            return "warn"
        if self.noisy or any(map(busy, self.experiments)) or any(self.inconclusive(n) for n in self.speedups):
            return "caution"
        return "ok"

    @property
    def verdict(self) -> str:
        variables = ", ".join(VARIABLES + tuple(self.vary))
        if self.equal_budget:
            line = (
                f"Equal-budget comparison: every control matches across {len(self.experiments)} experiments; "
                f"the variables are {variables}."
            )
        else:
            line = "Not an equal-budget comparison: " + "; ".join(self.differences) + "."
            if self.allow_different:
                line += (
                    " Speed-ups are shown because --allow-different was given; read them with these "
                    "differences in mind."
                )
            else:
                return line + (
                    " Speed-ups are withheld: rerun with equal controls, name an intended difference "
                    "with --vary KEY, or pass --allow-different."
                )
        return " ".join([line] + [self.speedup_line(n) for n in self.speedups])


def summary_frame(experiments: list, speedups: dict, paired: Paired | None = None) -> pd.DataFrame:
    """One row per experiment; `speedups` is empty where they are withheld."""
    records = []
    for exp in experiments:
        record = {
            "experiment": exp.name,
            "rev": exp.rev,
            "baseline": exp.baseline,
            "baseline_name": exp.baseline_name or "",
            "date": exp.timestamp or "",
            "command": exp.command,
            "source": exp.source,
            "device": exp.metric("device"),
            "precision": exp.metric("precision"),
        }
        record.update({col: exp.metric(key, (stage,)) for col, stage, key in SUMMARY})
        record.update({key: exp.metric(key) for key in ENVIRONMENT})
        record.update({f"param:{k}": display(v) for k, v in exp.params.items()})
        for stage, metrics in exp.metrics.items():
            record.update({f"{stage}:{k}": v for k, v in metrics.items()})
        records.append(record)
    frame = pd.DataFrame.from_records(records)
    names, nan = list(frame["experiment"]), float("nan")
    found = [speedups.get(n) for n in names]
    columns = {
        "speedup_vs_first": [1.0 if i == 0 and speedups else s.estimate if s else nan for i, s in enumerate(found)],
        "speedup_low": [s.low if s and s.has_interval else nan for s in found],
        "speedup_high": [s.high if s and s.has_interval else nan for s in found],
        "speedup_interval": [s.method if s else "" for s in found],
    }
    after = frame.columns.get_loc("tokens_per_second") + 1
    for offset, (column, values) in enumerate(columns.items()):
        frame.insert(after + offset, column, values)
    if paired is not None:
        for column, pick in (("", statistics.median), ("_min", min), ("_max", max)):
            frame["paired_tokens_per_second" + column] = [pick(paired.tokens_per_second(n)) for n in names]
        frame["paired_throughput_cv"] = [paired.median_cv(n) for n in names]
        frame["paired_rounds"] = len(paired.rounds)
    return frame


def busy(exp: Experiment) -> bool:
    """The experiment's benchmark ran while other processes took its cores (device/load.py)."""
    return exp.metric("busy_machine", ("benchmark",)) is True


def tokenizer_note(experiments: list) -> list:
    """Runs with different tokenizers: their per-token losses are not comparable, bits per byte are."""
    tokenizers = {(e.metric("vocab_size"), e.metric("tokenizer", ("train",))) for e in experiments}
    if len(tokenizers) < 2:
        return []
    described = " vs ".join(f"{e.name}: vocab_size {e.metric('vocab_size')}" for e in experiments)
    return [
        f"the runs' tokenizers differ ({described}): a loss per token moves with how many bytes a token "
        "holds, not only with the model, so their per-token losses are not compared; bits per byte of the "
        "validation text are (the same text, whatever tokenizer cut it)"
    ]


def caveats(experiments: list) -> list:
    """What the reader must know: noisy or busy measurements, figures a run did not record."""
    notes = [
        f"{e.name}: measured on a busy machine: other processes used "
        f"{e.metric('other_load_start', ('benchmark',)):.2f} cores at the benchmark's start and "
        f"{e.metric('other_load_end', ('benchmark',)):.2f} at its end, over {BUSY_SHARE:.0%} of the cores it "
        "ran on; its speed is lower than the machine's, rerun it when the machine is idle"
        for e in experiments
        if busy(e)
    ]
    notes += tokenizer_note(experiments)
    notes += [
        f"{e.name}: throughput varied {e.metric('throughput_cv', ('benchmark',)):.0%} between measured "
        f"intervals, over the {NOISY_CV:.0%} noise threshold (the machine was busy or throttling); rerun it on "
        "an idle machine, or compare on one machine with --paired, before trusting its speed"
        for e in experiments
        if is_noisy(e.metric("throughput_cv", ("benchmark",)))
    ]
    for e in experiments:
        if e.carried:
            notes.append(
                f"{e.name}: " + ", ".join(metrics_path(s).as_posix() for s in e.carried) + " unchanged from "
                "its baseline (those stages did not run in this experiment), so not reported as its own"
            )
        if e.source == "folder" and not e.params_recorded:
            notes.append(
                f"{e.name}: a metrics folder without params.yaml, so its params are not recorded; its "
                "controls were checked on the settings its metrics record (profile, shapes, batch, steps)"
            )
        if e.source == "folder" and not e.data:
            notes.append(
                f"{e.name}: a metrics folder without dvc.lock, so its token files could not be checked "
                "against the others' (copy the lock file of the commit whose data it used into the folder)"
            )
    for i, e in enumerate(experiments):
        bench = e.metrics.get("benchmark")
        twin = next((o for o in experiments[:i] if bench and o.metrics.get("benchmark") == bench), None)
        if twin is not None:
            notes.append(
                f"{e.name}: its benchmark metrics are identical to {twin.name}'s, timings included: one "
                "measurement, not two (DVC restores a cached result for unchanged params and data; "
                "`dvc exp run -f` measures again)"
            )
    for stage in ("benchmark", "estimate"):
        lacking = [e.name for e in experiments if stage not in e.metrics]
        if lacking:
            notes.append(
                f"{metrics_path(stage).as_posix()} is absent in {', '.join(lacking)}: its figures are "
                f"not reported there (run `dvc exp run ... {stage}` to record them)"
            )
    return notes


def compare(
    names: list,
    allow_different: bool = False,
    vary: list | None = None,
    rows: list | None = None,
    rounds: int | None = None,
) -> Comparison:
    """The comparison of the named experiments (or metrics folders); `rounds` re-measures them paired."""
    vary = list(vary or [])
    chosen, notes = select(names) if rows is None else select(names, rows, rows)
    kept, excluded = check_runs(chosen)
    if len(kept) < 2:
        why = "; ".join(f"{n}: {w}" for n, w in excluded) or "fewer than two experiments were found"
        raise UserError(
            f"nothing to compare: {len(kept)} usable experiment(s) ({why}); run at least two, e.g. "
            "`dvc exp run -n cpu-fp32 -S device=cpu -S precision=fp32`"
        )
    if len({e.name for e in kept}) < len(kept):
        raise UserError(
            "the same experiment is named twice; to compare a run with itself, run it twice under two "
            "names (`dvc exp run -n a ...`, `dvc exp run -n b ...`)"
        )
    table, differences = controls_table(kept, vary)
    comparison = Comparison(
        experiments=kept,
        excluded=excluded,
        controls=table,
        differences=differences,
        vary=vary,
        allow_different=allow_different,
        notes=notes + caveats(kept),
        created=datetime.now().astimezone().isoformat(timespec="seconds"),
    )
    if rounds is not None:
        if not comparison.speedups_shown:
            raise UserError(f"{comparison.verdict} --paired measures speed-ups only where they would be shown")
        comparison.paired = remeasure(kept, rounds)
        comparison.speedups = comparison.paired.speedups()
    elif comparison.speedups_shown:
        reference = kept[0].metrics.get("benchmark", {})
        found = {e.name: from_intervals(reference, e.metrics.get("benchmark", {})) for e in kept[1:]}
        comparison.speedups = {n: s for n, s in found.items() if s is not None}
    comparison.frame = summary_frame(kept, comparison.speedups, comparison.paired)
    comparison.curves = read_curves(kept)
    comparison.loss_key = loss_key(comparison.curves)
    comparison.target_loss = target_loss(comparison.curves, comparison.loss_key)
    return comparison
