"""DVC's record of experiments (`dvc exp show --json`: typed params, run states, data hashes; the
full metrics records from each commit through git), or a metrics folder from another machine, read
into one Experiment per run. Nothing is parsed from a printed table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from buildllm.config import config_to_dict, load_config
from buildllm.errors import UserError
from buildllm.metrics import read_metrics
from buildllm.paths import DATA, TOKENIZERS, metrics_path

STAGES = ("benchmark", "estimate", "train", "dry_run")  # metrics files, most specific first
PIPELINE = ("dry_run", "benchmark", "estimate", "train")  # the same stages in dvc.yaml's order


@dataclass
class Experiment:
    name: str
    rev: str  # the experiment's commit, or "workspace"
    params: dict  # params.yaml, flattened to dotted keys
    metrics: dict  # stage -> its flat metrics; absent files are absent
    data: dict  # data and tokenizer dependencies -> content hash
    baseline: str = ""  # the commit it started from ("": a metrics folder, or a workspace without one)
    baseline_name: str | None = None  # that commit's branch or tag, if any
    timestamp: str | None = None
    state: str = "success"  # success | failed | queued | running
    log: str | None = None
    returncode: int | None = None
    overrides: list = field(default_factory=list)  # `-S key=value` against the baseline's params
    stages: list = field(default_factory=list)  # stages whose metrics differ from the baseline's
    carried: list = field(default_factory=list)  # stages whose metrics file is the baseline's, unchanged
    source: str = "dvc"  # "dvc": an experiment or commit; "folder": a metrics folder
    params_recorded: bool = True  # False: a metrics folder without params.yaml

    def metric(self, key: str, stages: tuple = STAGES) -> Any:
        return next((self.metrics[s][key] for s in stages if key in self.metrics.get(s, {})), None)

    @property
    def command(self) -> str:
        if self.source == "folder":
            return f"measured elsewhere: metrics folder {self.rev}"
        parts = ["dvc exp run"]
        if self.rev != "workspace" and self.rev != self.baseline:
            parts.append(f"-n {self.name}")
        parts += [f"-S {item}" for item in self.overrides] + self.stages
        return " ".join(parts)


class Files:
    """Text of a project file in one place: the working tree, a commit, or a metrics folder."""

    def __init__(self, rev: str, source: str = "dvc"):
        self.rev, self.source = rev, source

    def text(self, path: Path) -> str | None:
        if self.source == "folder":
            root = Path(self.rev)
            root = root.parent if root.is_file() else root
            found = next((p for p in (root / path, root / path.name) if p.is_file()), None)
            return found.read_text(encoding="utf-8") if found else None
        if self.rev == "workspace":
            return path.read_text(encoding="utf-8") if path.is_file() else None
        shown = subprocess.run(["git", "show", f"{self.rev}:{path.as_posix()}"], capture_output=True, text=True)
        return shown.stdout if shown.returncode == 0 else None

    def json(self, path: Path):
        text = self.text(path)
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return None


def exp_show(all_commits: bool = False) -> list:
    """DVC's own record of the workspace, the baseline(s) and their experiments, with typed values."""
    cmd = [sys.executable, "-m", "dvc", "exp", "show", "--json"] + (["-A"] if all_commits else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(
            f"could not run `dvc exp show` ({exc}); check that dvc is installed in this environment"
        ) from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(
            f"`dvc exp show` failed ({why}); run buildllm compare (or report --experiment) from the "
            "project's root, a git repository with DVC initialised"
        )
    text = done.stdout
    try:
        return json.loads(text[text.index("[") :]) if "[" in text else []
    except json.JSONDecodeError as exc:
        raise UserError(
            f"`dvc exp show --json` printed something that is not JSON ({exc}); "
            "check the dvc version (`buildllm env`) and rerun"
        ) from None


def exp_show_every_commit() -> list:
    return exp_show(all_commits=True)


def flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return flat


def is_data(path: str) -> bool:
    """Under data/ or tokenizer/: the files whose content hashes say two runs read the same data."""
    return any(path == root or path.startswith(root + "/") for root in (DATA.as_posix(), TOKENIZERS.as_posix()))


def _record(entry: dict, name: str, baseline: str, baseline_name: str | None, executor: dict | None) -> Experiment:
    data = entry.get("data") or {}
    params = flatten(((data.get("params") or {}).get("params.yaml") or {}).get("data") or {})
    metrics = {}
    for stage in STAGES:
        # DVC shows only the stages' summaries (buildllm/metrics.py); the full record is a stage output
        # each experiment commits, read from git (the workspace's from disk). Commits made before the
        # summaries existed have it as a DVC metric, which `exp show` gives directly.
        record = ((data.get("metrics") or {}).get(metrics_path(stage).as_posix()) or {}).get("data")
        if not isinstance(record, dict) and entry.get("rev"):
            record = Files(entry["rev"]).json(metrics_path(stage))
        if isinstance(record, dict):
            metrics[stage] = record
    # Data identity by content hash: the tokenize stage's outputs as dvc.lock records them (exp show
    # merges deps across stages, so a stage that never ran can blank a dep's hash there).
    deps = {}
    for section in ("outs", "deps"):
        for path, info in (data.get(section) or {}).items():
            if is_data(path) and isinstance(info, dict) and info.get("hash") and path not in deps:
                deps[path] = info["hash"]
    executor = executor or {}
    state = executor.get("state")
    if state not in ("failed", "queued", "running"):
        state = "failed" if entry.get("error") else "success"
    local = executor.get("local") or {}
    return Experiment(
        name=name,
        rev=entry.get("rev") or name,
        baseline=baseline,
        baseline_name=baseline_name,
        timestamp=data.get("timestamp"),
        params=params,
        metrics=metrics,
        data=deps,
        state=state,
        log=local.get("log"),
        returncode=local.get("returncode"),
    )


def _yaml_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, list)) or value is None else str(value)


def read_experiments(rows: list) -> tuple[list, list]:
    """Every baseline commit and every experiment in `exp show` rows, with overrides against its baseline."""
    baselines, experiments = [], []
    workspace = None
    for row in rows:
        rev = row.get("rev")
        if rev == "workspace":
            workspace = _record(row, "workspace", "", None, None)
            continue
        baselines.append(_record(row, row.get("name") or rev[:7], rev, row.get("name"), None))
        for group in row.get("experiments") or []:
            revs = group.get("revs") or []
            if revs:
                name = group.get("name") or revs[0].get("name") or revs[0]["rev"][:7]
                experiments.append(_record(revs[0], name, rev, row.get("name"), group.get("executor")))
    experiments.sort(key=lambda e: e.timestamp or "")
    if workspace is not None and baselines:
        workspace.baseline, workspace.baseline_name = baselines[0].rev, baselines[0].name
        experiments.insert(0, workspace)
    by_rev = {b.rev: b for b in baselines}
    for exp in experiments:
        base = by_rev.get(exp.baseline)
        if base is None:
            continue
        exp.overrides = [f"{k}={_yaml_value(v)}" for k, v in exp.params.items() if base.params.get(k, v) != v]
        exp.stages = [s for s in PIPELINE if s in exp.metrics and exp.metrics[s] != base.metrics.get(s)]
        if exp.rev != "workspace":
            # An experiment commit holds every metrics file, also those of stages it did not run: those
            # are the baseline's numbers, not the experiment's, so they are set aside.
            exp.carried = [s for s in PIPELINE if s in exp.metrics and s not in exp.stages]
            exp.metrics = {s: m for s, m in exp.metrics.items() if s not in exp.carried}
    return baselines, experiments


def select(names: list, rows_default=exp_show, rows_all=exp_show_every_commit) -> tuple[list, list]:
    """The experiments to compare: the named ones (experiment names, commits, branches, `workspace`,
    metrics folders) in the order given, or the workspace and every experiment of the current
    baseline. The rows may be a callable: `dvc exp show` then runs only if a name needs it, and
    `rows_all` (None: none) only if a name is not among the first rows."""
    if names and all(is_metrics_folder(n) for n in names):
        return [read_folder(n) for n in names], []
    baselines, experiments = read_experiments(rows_default() if callable(rows_default) else rows_default)
    if not names:
        workspace = next((e for e in experiments if e.rev == "workspace"), None)
        applied = [e for e in experiments if workspace and e is not workspace and _applied(e, workspace)]
        if not applied:
            return experiments, []
        experiments.remove(workspace)
        return experiments, [
            f"workspace: identical to experiment {applied[0].name} (its results are applied there); shown once"
        ]
    pool, more = baselines + experiments, rows_all
    chosen = []
    for name in names:
        if is_metrics_folder(name):
            chosen.append(read_folder(name))
            continue
        found = _find(name, pool)
        if found is None and more is not None:  # another baseline's experiment, e.g. one pulled from elsewhere
            pool = [e for group in read_experiments(more() if callable(more) else more) for e in group]
            more = None
            found = _find(name, pool)
        if found is None:
            raise UserError(
                f"no experiment, commit, branch or metrics folder named {name!r}; `dvc exp show -A` "
                "lists experiments (fetch another machine's with `dvc exp pull origin NAME`); a metrics "
                "folder holds benchmark.json, estimate.json, ..."
            )
        chosen.append(found)
    return chosen, []


def _applied(exp: Experiment, workspace: Experiment) -> bool:
    """The workspace holds `exp`'s params and results (`dvc exp apply` put them there)."""
    return exp.params == workspace.params and all(workspace.metrics.get(s) == m for s, m in exp.metrics.items())


def _find(name: str, candidates: list) -> Experiment | None:
    return next((e for e in candidates if name == e.name or (len(name) >= 7 and e.rev.startswith(name))), None)


# A metrics folder from another machine (a GPU box without DVC, a run kept outside git): the stages'
# metrics files, directly or in metrics/, or one run's file alone (its params in NAME.params.yaml).
# A params.yaml (completed with the defaults, as the run was) and the dvc.lock of the commit whose
# data it used, copied beside them, make its controls as checked as an experiment's; without them
# those rows are "not recorded" (docs/across-machines.md).


def _metrics_dir(path: Path) -> Path | None:
    for folder in (path, path / "metrics"):
        if folder.is_dir() and any((folder / f"{stage}.json").is_file() for stage in STAGES):
            return folder
    return None


def _metrics_file(path: Path) -> bool:
    """One run's metrics file on its own, e.g. benchmarks/h200/runs/iter1_bf16.json."""
    return path.is_file() and path.suffix == ".json"


def is_metrics_folder(name: str) -> bool:
    return _metrics_file(Path(name)) or _metrics_dir(Path(name)) is not None


def _data_hashes(lock: Path) -> dict:
    try:
        stages = (yaml.safe_load(lock.read_text()) or {}).get("stages") or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{lock} is not valid YAML ({str(exc).splitlines()[0]}); copy the lock file again") from None
    hashes = {}
    for stage in stages.values():
        for entry in (stage.get("outs") or []) + (stage.get("deps") or []):
            path, digest = entry.get("path", ""), entry.get("md5") or entry.get("hash")
            if is_data(path) and isinstance(digest, str) and digest != "md5" and path not in hashes:
                hashes[path] = digest
    return hashes


def read_folder(name: str) -> Experiment:
    path, lone = Path(name), _metrics_file(Path(name))
    if lone:  # a lone file: that stage's metrics (benchmark's unless named after a stage)
        stage = path.stem if path.stem in STAGES else "benchmark"
        files, path = {stage: path}, path.parent
    else:  # select() reads only what is_metrics_folder() found: a lone file or a folder with one
        folder = _metrics_dir(path)
        files = {s: folder / f"{s}.json" for s in STAGES}
    again = "copy it again from the machine that ran it"
    metrics = {stage: read_metrics(file, advice=again) for stage, file in files.items() if file.is_file()}
    # A lone file's params are its own (x.params.yaml beside x.json); a folder's are its params.yaml.
    params_file = path / (f"{Path(name).stem}.params.yaml" if lone else "params.yaml")
    params = flatten(config_to_dict(load_config(params_file))) if params_file.is_file() else {}
    lock = path / "dvc.lock"
    label = name.rstrip("/") or name
    return Experiment(
        name=label,
        rev=label,
        params=params,
        metrics=metrics,
        data=_data_hashes(lock) if lock.is_file() else {},
        source="folder",
        params_recorded=params_file.is_file(),
    )
