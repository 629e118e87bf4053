"""`python -m buildllm.report.measured save`: one run's records into benchmarks/<machine-id>/NAME/,
from this workspace's metrics/, another metrics folder, one benchmark record, or a DVC experiment
(a run `buildllm import-runs` brought home, or a CPU twin `scripts/gpu_home.py` made)."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

from buildllm.atomic import atomic_write_text
from buildllm.errors import UserError
from buildllm.metrics import read_metrics
from buildllm.paths import metrics_path
from buildllm.report.experiments import Files

BENCHMARKS = Path("benchmarks")
STAGES = ("dry_run", "benchmark", "estimate", "train")  # the records a run folder may hold
# An experiment's params, kept beside its records (`buildllm compare` checks controls from them); not its
# dvc.lock, a few thousand lines a run: the comparison made at home checked the data hashes.
RUN_FILES = ("params.yaml",)


def _experiment_rev(name: str) -> str:
    listed = subprocess.run(
        ["git", "for-each-ref", "--format=%(objectname) %(refname)", "refs/exps"], capture_output=True, text=True
    ).stdout
    found = [rev for rev, ref in (line.split() for line in listed.splitlines()) if ref.rsplit("/", 1)[-1] == name]
    if not found:
        raise UserError(
            f"no DVC experiment named {name} here: `dvc exp show` lists them, and `buildllm import-runs` "
            "makes a runs archive's"
        )
    return found[0]


def _texts(metrics: Path, experiment: str | None) -> dict:
    """The files to keep, by name: the machine's and the stages' records (and, from an experiment, its
    params.yaml)."""
    if experiment:
        rev = _experiment_rev(experiment)
        files, baseline = Files(rev), Files(f"{rev}^")
        texts = {f"{s}.json": files.text(metrics_path(s)) for s in ("machine", *STAGES)}
        # A stage that did not run in the experiment left the baseline's record in its commit: not its own.
        texts |= {f"{s}.json": None for s in STAGES if texts[f"{s}.json"] == baseline.text(metrics_path(s))}
        texts |= {name: files.text(Path(name)) for name in RUN_FILES}
    elif metrics.is_file():  # one record on its own, as `buildllm benchmark` writes it
        texts = {"benchmark.json": metrics.read_text()}
    else:
        texts = {f"{s}.json": _read(metrics / f"{s}.json") for s in ("machine", *STAGES)}
    return {name: text for name, text in texts.items() if text is not None}


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def _record(text: str, what: str) -> dict:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} is not valid JSON ({exc}); copy it again from the run") from None
    if not isinstance(record, dict):
        raise UserError(f"{what} must hold a JSON object; copy it again from the run")
    return record


def save(
    name: str,
    note: str,
    command: str,
    metrics: Path = Path("metrics"),
    root: Path = BENCHMARKS,
    today: str | None = None,
    experiment: str | None = None,
    reference: str | None = None,
) -> Path:
    """One run's records into root/<machine-id>/NAME/: from a metrics folder, one benchmark record
    (its machine already under root), or a DVC experiment. `reference` (MACHINE-ID/RUN under root)
    is the run its speed-up is measured against."""
    if not name or any(c in name for c in "/\\ ") or name in (".", ".."):
        raise UserError(f"run name {name!r} must be one folder name without spaces, such as iteration1-defaults")
    source = f"experiment {experiment}" if experiment else str(metrics)
    texts = _texts(metrics, experiment)
    if "benchmark.json" not in texts:
        raise UserError(f"{source} holds no benchmark record (benchmark.json); run the benchmark stage there first")
    benchmark = _record(texts["benchmark.json"], f"the benchmark record of {source}")
    known = root / str(benchmark.get("machine_id")) / "machine.json"
    if "machine.json" in texts:
        machine = _record(texts["machine.json"], f"the machine record of {source}")
    elif known.is_file():
        machine = read_metrics(known)
    else:
        raise UserError(
            f"{source} has no machine record, and {root}/ holds none for machine {benchmark.get('machine_id')}: "
            "save a run of that machine with its machine.json first"
        )
    if benchmark.get("machine_id") != machine["machine_id"]:
        raise UserError(
            f"the benchmark of {source} was measured on machine {benchmark.get('machine_id')}, but its machine "
            f"record is {machine['machine_id']}: rerun `dvc repro` here first"
        )
    if reference and not (root / reference / "benchmark.json").is_file():
        missing = root / reference / "benchmark.json"
        raise UserError(f"reference {reference} is no saved run ({missing} does not exist); save it first")
    folder = root / machine["machine_id"] / name
    folder.mkdir(parents=True, exist_ok=True)
    if "machine.json" in texts:
        atomic_write_text(folder.parent / "machine.json", texts["machine.json"])
    for file in (*(f"{s}.json" for s in STAGES), *RUN_FILES):
        if file in texts:
            atomic_write_text(folder / file, texts[file])
        else:  # a record this run did not write must not stay from an earlier run of that name
            (folder / file).unlink(missing_ok=True)
    run = {"date": today or datetime.date.today().isoformat(), "command": command, "note": note}
    if reference:
        run["reference"] = reference
    atomic_write_text(folder / "run.json", json.dumps(run, indent=2) + "\n")
    return folder
