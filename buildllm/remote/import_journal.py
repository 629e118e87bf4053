"""What makes `buildllm import-runs` all or nothing, also under kill -9: before it touches anything, a
journal (written atomically) records the workspace files it will overwrite, where HEAD points and the
refs `dvc exp save` may write. A failed import rolls back from it at once; a killed one is rolled back
at the start of the next `buildllm` command in this project, once its processes are gone.

The refs: the experiments of the archive's run names, DVC's exec refs and the stashes `dvc exp save`
pushes and pops (git's own and DVC's workspace queue's). Other experiments (a queue running beside
the import) are never touched.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from buildllm.atomic import atomic_write, atomic_write_text
from buildllm.errors import UserError

JOURNAL = Path(".dvc/tmp/buildllm-import-runs.json")
SCRATCH_REFS = ("refs/exps/exec/", "refs/exps/stash", "refs/stash")
STACKS = ("refs/exps/stash", "refs/stash")  # stashes: a stack in the ref's reflog
TEST_KILL = "BUILDLLM_TEST_KILL_AT"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def stop_at(phase: str) -> None:
    """A named point where a test kills the import (BUILDLLM_TEST_KILL_AT=phase): a real SIGKILL."""
    if os.environ.get(TEST_KILL) == phase:
        os.kill(os.getpid(), signal.SIGKILL)


def refs(names: list[str]) -> dict[str, str]:
    """The refs an import of runs named `names` may write, with the commits they point at."""
    listing = _git("for-each-ref", "--format=%(refname) %(objectname)", "refs/exps", "refs/stash").stdout
    pairs = [line.split() for line in listing.splitlines() if line.strip()]
    return {ref: sha for ref, sha in pairs if ref.startswith(SCRATCH_REFS) or ref.rsplit("/", 1)[-1] in names}


def _process() -> list:
    me = psutil.Process()
    return [me.pid, me.create_time()]


def begin(archive: str, names: list[str], paths: list[str]) -> dict:
    """Record the state the import may change; returns the record (the files' original bytes)."""
    files = {p: base64.b64encode(Path(p).read_bytes()).decode() if Path(p).is_file() else None for p in paths}
    folders = {str(folder) for p in paths for folder in Path(p).parents if str(folder) != "." and not folder.exists()}
    record = {
        "archive": str(archive),
        "names": names,
        "head": _git("symbolic-ref", "-q", "HEAD").stdout.strip(),  # "" when detached
        "refs": refs(names),
        "files": files,
        "folders": sorted(folders, key=lambda f: len(Path(f).parts), reverse=True),
        "processes": [_process()],
    }
    atomic_write_text(JOURNAL, json.dumps(record))
    return record


def add_process(record: dict, pid: int) -> None:
    """A child (`dvc exp save`) that may outlive a killed import: recovery waits until it is gone."""
    record["processes"].append([pid, psutil.Process(pid).create_time()])
    atomic_write_text(JOURNAL, json.dumps(record))


def restore_files(record: dict) -> None:
    for path, data in record["files"].items():
        if data is None:
            Path(path).unlink(missing_ok=True)
        else:
            atomic_write(path, lambda tmp, data=data: tmp.write_bytes(base64.b64decode(data)))
    for folder in map(Path, record["folders"]):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _put_back(ref: str, sha: str | None) -> None:
    if sha is None:
        _git("update-ref", "-d", "--no-deref", ref)  # its reflog goes with it
        return
    for _ in range(20):  # a stash the import pushed onto: drop its entries, not the user's
        if ref not in STACKS or _git("rev-parse", "-q", "--verify", ref).stdout.strip() == sha:
            break
        _git("reflog", "delete", "--updateref", "--rewrite", f"{ref}@{{0}}")
    _git("update-ref", "--no-deref", ref, sha)


def rollback(record: dict) -> list[str]:
    """Back to the recorded state; returns the experiments removed (or put back as they were)."""
    # `dvc exp save` commits on a detached HEAD (the branch never moves) and stages the run's files.
    if record["head"] and not _git("symbolic-ref", "-q", "HEAD").stdout.strip():
        _git("symbolic-ref", "HEAD", record["head"])
    _git("reset", "-q", "--", *record["files"])
    before, now = record["refs"], refs(record["names"])
    changed = sorted(ref for ref in set(before) | set(now) if before.get(ref) != now.get(ref))
    for ref in changed:
        _put_back(ref, before.get(ref))
    restore_files(record)
    JOURNAL.unlink(missing_ok=True)
    return sorted({ref.rsplit("/", 1)[-1] for ref in changed if not ref.startswith(SCRATCH_REFS)})


def _running(processes: list) -> list[int]:
    alive = []
    for pid, started in processes:
        try:
            process = psutil.Process(pid)
            # A killed child nobody reaped stays a zombie: it runs no more.
            if abs(process.create_time() - started) < 1.0 and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def recover() -> None:
    """At the start of every command: roll back an import that was killed, once none of it runs."""
    if not JOURNAL.is_file() or os.environ.get("RANK", "0") != "0":  # under torchrun, one rank recovers
        return
    try:
        record = json.loads(JOURNAL.read_text())
    except (OSError, ValueError):
        raise UserError(
            f"{JOURNAL} (the record of an interrupted `buildllm import-runs`) does not read; check "
            "`git status`, restore what it lists with `git checkout -- FILE`, then delete that file"
        ) from None
    if _running(record["processes"]):
        return  # still importing: it finishes or rolls back by itself
    restored, removed = len(record["files"]), rollback(record)
    print(
        f"warning: `buildllm import-runs {record['archive']}` was stopped before it finished; put back the "
        f"{restored} workspace file(s) it had replaced and removed the experiments it had begun "
        f"({', '.join(removed) or 'none yet'}): nothing of it was imported; run it again",
        file=sys.stderr,
    )
