"""`buildllm import-runs FILE`: each run of a runs archive (buildllm pack-run) becomes a DVC
experiment of this project, recorded by DVC itself (`dvc exp save`; the steps: docs/gpu.md).

`machine` is the one stage `dvc exp save` re-hashes, from the run's own machine record; every other
stage's lock entry, with the content hashes of the token files the run read, stays the run's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from buildllm.errors import UserError
from buildllm.metrics import json_line
from buildllm.remote import archive


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def existing_experiments() -> set[str]:
    refs = _git("for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    return {ref.rsplit("/", 1)[-1] for ref in refs}


def check_project() -> None:
    if not Path("dvc.yaml").is_file() or not Path(".dvc").is_dir():
        raise UserError("import-runs runs in the project's root (dvc.yaml and .dvc/ here); cd there and rerun")
    if _git("rev-parse", "--verify", "-q", "HEAD").returncode != 0:
        raise UserError("this project has no git commit for the experiments to start from; commit once, then rerun")
    if dirty := _git("status", "--porcelain", "--untracked-files=no").stdout.splitlines():
        raise UserError(
            f"the workspace has uncommitted changes ({', '.join(line[3:] for line in dirty[:3])}"
            f"{', ...' if len(dirty) > 3 else ''}); record this machine's run first: commit it (`git add -A && git "
            "commit`), or `dvc exp save -n NAME` it and `git stash`: `dvc exp save` would put it in every imported run"
        )


def save(run: archive.Run, force: bool) -> None:
    """One run as an experiment; the workspace's files come back as they were, whatever happens."""
    paths = sorted(run.files)
    tracked = set(_git("ls-files", "-z", "--", *paths).stdout.split("\0"))
    backup = {p: Path(p).read_bytes() if Path(p).is_file() else None for p in paths}
    made = [p for p in {Path(p).parent for p in paths} if not p.exists()]
    try:
        for path, data in run.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(data)
        untracked = [flag for p in paths if p not in tracked for flag in ("-I", p)]
        command = [sys.executable, "-m", "dvc", "exp", "save", "-q", "-n", run.name, *untracked]
        done = subprocess.run([*command, *(["-f"] if force else []), "machine"], capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no message"])[-1]
            raise UserError(f"`dvc exp save` refused run {run.name} ({why}); the workspace is as it was")
    finally:
        for path, data in backup.items():
            if data is None:
                Path(path).unlink(missing_ok=True)
            else:
                Path(path).write_bytes(data)
        for folder in sorted(made, key=lambda p: len(p.parts), reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def command(args) -> None:
    path, force = args.file, args.force
    runs = archive.read(path)  # the whole archive is checked before anything here changes
    check_project()
    if not runs:
        raise UserError(f"{path} holds no runs; nothing to import")
    taken = sorted({r.name for r in runs} & existing_experiments())
    if taken and not force:
        raise UserError(
            f"experiments named {', '.join(taken)} exist already; `dvc exp remove NAME` them, "
            "or pass --force to replace"
        )
    json_line(import_runs=str(path), runs=[r.name for r in runs])
    for run in runs:
        save(run, force)
        took = f" in {run.seconds:.0f} s" if run.seconds is not None else ""
        print(f"experiment {run.name}: stages {', '.join(run.stages)}{took}, with {' '.join(run.overrides) or 'no -S'}")
    print(f"`dvc exp show` lists them; compare one with a run here: buildllm compare <here> {runs[-1].name}")


def add_arguments(parser) -> None:
    parser.add_argument("file", help="a runs archive written by `buildllm pack-run --into FILE`")
    parser.add_argument("--force", action="store_true", help="replace experiments of the same names")
