"""`buildllm carry`: what a GPU machine with git needs, by git's and DVC's own means (docs/gpu.md).

A bare clone of the committed project (`carry/project.git`) and a DVC remote that is a plain folder
(`carry/dvc-store`), holding the outputs of the stages that machine cannot or need not run: the
corpus (its package may be missing there) and every vocabulary's token files and tokenizer. There,
`dvc pull` restores them by their hashes in the committed dvc.lock, so `dvc exp run` skips both
stages. Sized against the limit on what travels, with the wheelhouse if there is one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from buildllm.errors import UserError
from buildllm.units import size

STAGES = ("corpus", "tokenize")  # their outputs travel; every other stage runs there
REMOTE = "carry"  # the DVC remote's name, in .dvc/config.local (never committed: a path of this machine)


def _run(what: str, *command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"{what} failed ({why}); fix that and rerun `buildllm carry`")
    return done.stdout


def dvc(*args: str) -> str:
    return _run(f"`dvc {args[0]}`", sys.executable, "-m", "dvc", *args)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def check_committed() -> None:
    if not Path("dvc.yaml").is_file() or not Path(".dvc").is_dir():
        raise UserError("buildllm carry runs in the project's root (dvc.yaml and .dvc/ here); cd there and rerun")
    if subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], capture_output=True).returncode != 0:
        raise UserError("this project has no git commit to clone; run `dvc repro`, commit its results, then rerun")
    dirty = _run("`git status`", "git", "status", "--porcelain", "--untracked-files=no").splitlines()
    if dirty:
        raise UserError(
            f"the workspace has uncommitted changes ({', '.join(line[3:] for line in dirty[:3])}"
            f"{', ...' if len(dirty) > 3 else ''}); commit the first run's results (`git add -A && git commit`) "
            "or stash them: the GPU machine's clone starts from the commit, and its runs are compared with it"
        )
    if stale := sorted(json.loads(dvc("status", "--json", *STAGES) or "{}")):
        raise UserError(
            f"the outputs of {', '.join(stale)} differ from dvc.lock or are missing; run `dvc repro` and "
            "commit its results, then rerun"
        )


def command(args) -> None:
    check_committed()
    into = Path(args.into).resolve()
    store, repo = into / "dvc-store", into / "project.git"
    into.mkdir(parents=True, exist_ok=True)
    # Rebuilt whole: an earlier carry's objects would travel (and count) for nothing.
    for old in (store, repo):
        shutil.rmtree(old, ignore_errors=True)
    # An absolute path: DVC resolves a relative one against the filesystem's root in `dvc exp push`.
    dvc("remote", "add", "--local", "--force", REMOTE, str(store))
    dvc("push", "--quiet", "--remote", REMOTE, *STAGES)
    _run("`git clone --bare`", "git", "clone", "--quiet", "--bare", "--no-local", ".", str(repo))
    wheelhouse = Path(args.wheelhouse)
    wheels = folder_bytes(wheelhouse)
    parts = {
        "project.git (the committed tree, with history)": folder_bytes(repo),
        "dvc-store (corpus, token files, tokenizers)": folder_bytes(store),
        f"{wheelhouse} (DVC for a machine without it)" + ("" if wheels else ": none; `buildllm wheelhouse`"): wheels,
    }
    total, limit = sum(parts.values()), args.limit_mib * 2**20
    for name, n in parts.items():
        print(f"  {size(n):>10}  {name}")
    print(f"  {size(total):>10}  in all, of the {args.limit_mib:g} MiB limit")
    if total > limit:
        raise UserError(
            f"what travels ({into.name}/ as written, and {wheelhouse}/) is {size(total)}, over the "
            f"{args.limit_mib:g} MiB limit; leave out what the target has "
            "(`buildllm wheelhouse --has ...`), fewer tokenize.vocabularies, or raise --limit-mib"
        )
    print(
        f"carry {into.name}/ (and {wheelhouse}/ where DVC is missing) to the GPU machine; there (docs/gpu.md):\n"
        f"  git clone {into.name}/project.git project && cd project\n"
        f'  dvc remote add --local {REMOTE} "$(cd ../{into.name}/dvc-store && pwd)"\n'
        f"  dvc pull -r {REMOTE} {' '.join(STAGES)}\n"
        "  dvc exp run -n NAME -S device=cuda ... && dvc exp push origin NAME --no-cache\n"
        f"then here, with {into.name}/project.git copied back: dvc exp pull {repo} NAME --no-cache"
    )


def add_arguments(parser) -> None:
    parser.add_argument("--into", default="carry", help="the folder to write (default carry/, git-ignored)")
    parser.add_argument("--wheelhouse", default="wheelhouse", help="counted in the size when present")
    parser.add_argument("--limit-mib", type=float, default=56.0, help="refuse above this size (default 56)")
