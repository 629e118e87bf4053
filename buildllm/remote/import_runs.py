"""`buildllm import-runs FILE`: each run of a runs archive (buildllm pack-run) becomes a DVC
experiment of this project, recorded by DVC itself (`dvc exp save`; the steps: docs/gpu.md). All or
nothing, also under kill -9: buildllm/remote/import_journal.py.

`machine` is the one stage `dvc exp save` re-hashes, from the run's own machine record; every other
stage's lock entry, with the content hashes of the token files the run read, stays the run's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from buildllm.atomic import atomic_write
from buildllm.errors import UserError
from buildllm.metrics import json_line
from buildllm.remote import archive, import_journal


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


def dvc_message(done: subprocess.CompletedProcess) -> str:
    """DVC's own reason on one line: its error's lines, without warnings or the numbered lines of a
    file it quotes."""
    lines = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines()]
    quoted = re.compile(r"(WARNING|\d+(\s|$))")
    said = [line.removeprefix("ERROR:").strip() for line in lines if line and not quoted.match(line)]
    return " ".join(said[:3]) or f"it exited {done.returncode} and said nothing"


def save(run: archive.Run, force: bool, record: dict) -> None:
    """One run as an experiment; the workspace's files are put back afterwards (the journal has them)."""
    paths = sorted(run.files)
    tracked = set(_git("ls-files", "-z", "--", *paths).stdout.split("\0"))
    for path, data in run.files.items():
        atomic_write(path, lambda tmp, data=data: tmp.write_bytes(data))
    import_journal.stop_at("written")
    untracked = [flag for p in paths if p not in tracked for flag in ("-I", p)]
    command = [sys.executable, "-m", "dvc", "exp", "save", "-n", run.name, *untracked, *(["-f"] if force else [])]
    child = subprocess.Popen([*command, "machine"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import_journal.add_process(record, child.pid)
    try:
        out, err = child.communicate()
    except BaseException:  # Ctrl-C: the rollback waits for DVC to be gone
        child.kill()
        child.wait()
        raise
    import_journal.stop_at("saved")
    if child.returncode != 0:
        why = dvc_message(subprocess.CompletedProcess(command, child.returncode, out, err))
        raise UserError(
            f"`dvc exp save` refused run {run.name} ({why}); nothing was imported and the workspace is as it "
            "was; fix what DVC names (a run's own file: remake the run with `buildllm pack-run`) and rerun"
        )
    import_journal.restore_files(record)
    import_journal.stop_at("restored")


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
    # All or nothing: every run becomes an experiment, or none does and the workspace is as it was.
    record = import_journal.begin(str(path), [r.name for r in runs], sorted({p for r in runs for p in r.files}))
    try:
        import_journal.stop_at("journal")
        for run in runs:
            save(run, force, record)
    except BaseException:
        import_journal.rollback(record)
        raise
    import_journal.JOURNAL.unlink()
    for run in runs:
        took = f" in {run.seconds:.0f} s" if run.seconds is not None else ""
        print(f"experiment {run.name}: stages {', '.join(run.stages)}{took}, with {' '.join(run.overrides) or 'no -S'}")
    print(f"`dvc exp show` lists them; compare one with a run here: buildllm compare <here> {runs[-1].name}")


def add_arguments(parser) -> None:
    parser.add_argument("file", help="a runs archive written by `buildllm pack-run --into FILE`")
    parser.add_argument("--force", action="store_true", help="replace experiments of the same names")
