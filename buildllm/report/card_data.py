"""What a run card shows, read from the files a run left: the workspace's, an experiment's commit's
(through git, as `buildllm compare` reads them), or a metrics folder from another machine. A file an
experiment carries unchanged from its baseline (its stage did not run) is set aside with that reason.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from buildllm.paths import TRAIN_LOG_CSV, TRAIN_LOG_JSON, metrics_path
from buildllm.report.experiments import Files, select
from buildllm.report.sample import SAMPLE_PATH

CARD_STAGES = ("dry_run", "benchmark", "estimate", "train", "machine")
PLAN_STAGES = ("train", "dry_run", "benchmark")  # a fact of the plan: what the run used, else what was planned


@dataclass
class CardData:
    name: str  # "workspace", an experiment's name, or a metrics folder
    rev: str  # "workspace", the commit, or the folder
    records: dict  # stage -> its metrics (absent stages are absent)
    notes: dict  # stage -> its notes (reasons, full labels)
    rows: list  # the training log's rows, numbers as numbers (None: no value)
    sample: dict | None  # metrics/sample_notes.json
    absent: dict = field(default_factory=dict)  # what is not shown as this run's, and why

    def get(self, stage: str, key: str):
        return self.records.get(stage, {}).get(key)

    def note(self, stage: str, key: str):
        """The full text of a reason or label: the notes' when the stage wrote one, else the metric's."""
        return self.notes.get(stage, {}).get(key, self.get(stage, key))

    def first(self, key: str, notes: bool = False):
        """A fact of the plan (with `notes`, its reason) from the first of PLAN_STAGES that recorded it."""
        for stage in PLAN_STAGES:
            value = (self.notes if notes else self.records).get(stage, {}).get(key)
            if value is not None:
                return value
        return None


def log_rows(files: Files) -> list:
    """The training log: the JSON twin, or for runs made before it the CSV, its cells read as numbers."""
    rows = files.json(TRAIN_LOG_JSON)
    if isinstance(rows, list):
        return [r for r in rows if isinstance(r, dict)]
    return [
        {k: (float(v) if v not in ("", None) else None) for k, v in r.items()}
        for r in csv.DictReader(io.StringIO(files.text(TRAIN_LOG_CSV) or ""))
    ]


def read_card(name: str | None = None) -> CardData:
    """The workspace's card data, or `name`'s: an experiment, commit, branch or metrics folder, as compare finds it."""
    exp = select([name])[0][0] if name else None
    files, carried = (Files(exp.rev, exp.source), exp.carried) if exp else (Files("workspace"), [])
    records, notes, absent = {}, {}, {}
    for stage in CARD_STAGES:
        if stage in carried:
            absent[metrics_path(stage).as_posix()] = "its baseline's: the stage did not run in this experiment"
            continue
        record = files.json(metrics_path(stage))
        if isinstance(record, dict):
            records[stage] = record
            found = files.json(metrics_path(f"{stage}_notes"))
            notes[stage] = found if isinstance(found, dict) else {}
        else:
            absent[metrics_path(stage).as_posix()] = "absent"
    rows, sample = [], None
    if "train" in carried:
        absent[TRAIN_LOG_JSON.as_posix()] = absent[SAMPLE_PATH.as_posix()] = "its baseline's, with train"
    else:
        rows, sample = log_rows(files), files.json(SAMPLE_PATH)
    sample = sample if isinstance(sample, dict) else None
    return CardData(exp.name if exp else "workspace", files.rev, records, notes, rows, sample, absent)
