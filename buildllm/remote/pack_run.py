"""`buildllm pack-run`: `dvc exp run -n NAME -S ...` for a machine without git, where DVC's
experiments cannot run but `dvc repro` can (with core.no_scm). Each run is made in a scratch copy of
the project, so the project itself is not changed, and added to a runs archive that `buildllm
import-runs` turns into a DVC experiment at home (what it runs and carries: docs/gpu.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from buildllm.config import load_config
from buildllm.errors import UserError
from buildllm.knob import set_dotted
from buildllm.metrics import json_line
from buildllm.remote import archive
from buildllm.yaml_text import yaml_problem

# Never copied into the scratch project: history, environments, the corpus's caches, results.
SKIP = {".git", ".venv", ".venv-gpu", "wheelhouse", "checkpoints", "reports", "gpu_check_out", "__pycache__"}
LINKED = ("data", "tokenizer")  # big, read-only inputs: hard links where the file system allows


class RunFailed(UserError):
    exit_code = 3


def parse_overrides(items: list[str]) -> dict:
    """`-S key=value` as DVC reads it: the value is YAML (16, bf16, null, false)."""
    values = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"-S {item!r} is not key=value; write e.g. -S device=cuda -S train.batch_size=16")
        try:
            values[key.strip()] = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise UserError(
                f"-S {item!r}: the value is not valid YAML ({yaml_problem(exc, text)}); quote it to pass it as text"
            ) from None
    return values


def _link(src, dst) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or no hard links there
        shutil.copy2(src, dst)


def scratch_copy(project: Path, dest: Path) -> None:
    for item in project.iterdir():
        if item.name in SKIP or (item.name in LINKED and not item.is_dir()):
            continue
        if item.name in LINKED:
            shutil.copytree(item, dest / item.name, copy_function=_link, symlinks=True)
        elif item.is_dir():
            # DVC's cache and temp folder stay behind: the scratch copy starts its own.
            kept_back = ("cache", "tmp", "config.local") if item.name == ".dvc" else ()
            shutil.copytree(item, dest / item.name, ignore=shutil.ignore_patterns(*kept_back, *SKIP), symlinks=True)
        else:
            shutil.copy2(item, dest / item.name)


def stage_files(dvc_yaml: dict, stages: list[str]) -> list[str]:
    """The metrics files (under metrics/) that `stages` write, as dvc.yaml declares them."""
    sections = [dvc_yaml["stages"][stage].get(section) or [] for stage in stages for section in ("outs", "metrics")]
    paths = [next(iter(entry)) if isinstance(entry, dict) else entry for entries in sections for entry in entries]
    return list(dict.fromkeys(path for path in paths if path.startswith("metrics/")))


def environment(scratch: Path) -> dict:
    """DVC's stage commands run `python`: this Python, whatever PATH holds, with the copy's buildllm first."""
    shims = scratch / ".buildllm-bin"
    shims.mkdir()
    shim = shims / "python"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    path = f"{shims}{os.pathsep}{os.environ.get('PATH', '')}"
    pythonpath = os.pathsep.join(filter(None, [str(scratch), os.environ.get("PYTHONPATH")]))
    return {"DVC_NO_ANALYTICS": "1", **os.environ, "PATH": path, "PYTHONPATH": pythonpath}


def command(args) -> None:
    name, overrides, stages = args.name, args.overrides, args.stages
    archive.check_name(name)
    project_path, into_path = Path(args.project).resolve(), Path(args.into).resolve()
    if not (project_path / "dvc.yaml").is_file():
        raise UserError(f"{project_path} has no dvc.yaml; run pack-run from the project's root (or pass --project)")
    if importlib.util.find_spec("dvc") is None:
        raise UserError(
            "DVC is not installed in this Python; install it from a carried wheelhouse: "
            f"{Path(sys.executable).name} -m pip install --no-index --find-links wheelhouse dvc"
        )
    dvc_yaml = yaml.safe_load((project_path / "dvc.yaml").read_text())
    allowed = [s for s in dvc_yaml.get("stages", {}) if s not in ("corpus", "tokenize")]
    if not set(stages) <= set(allowed):
        raise UserError(
            f"stages {stages} are not all stages of dvc.yaml after tokenize; name some of: {', '.join(allowed)}"
        )
    values = parse_overrides(overrides)
    load_config(project_path / "params.yaml", values)  # an unknown key or bad value stops here, in one line
    if into_path.exists():
        archive.read(into_path)  # a damaged archive is refused before the run, not after it
    run_stages = ["machine", *[s for s in stages if s != "machine"]]
    json_line(pack_run=name, stages=run_stages, overrides=overrides, into=str(into_path))
    with tempfile.TemporaryDirectory(prefix="buildllm-run-") as folder:
        scratch = Path(folder) / "project"
        scratch.mkdir()
        scratch_copy(project_path, scratch)
        params = yaml.safe_load((scratch / "params.yaml").read_text()) or {}
        for key, value in values.items():
            set_dotted(params, key, value)
        (scratch / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        env = environment(scratch)
        dvc = [sys.executable, "-m", "dvc"]
        if not (scratch / ".dvc").is_dir():
            subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=scratch, env=env, check=True)
        subprocess.run([*dvc, "config", "--local", "core.no_scm", "true"], cwd=scratch, env=env, check=True)
        began = time.monotonic()
        done = subprocess.run([*dvc, "repro", "--force", "--single-item", *run_stages], cwd=scratch, env=env)
        seconds = round(time.monotonic() - began, 1)
        if done.returncode != 0:
            raise RunFailed(
                f"`dvc repro` of run {name} failed (exit code {done.returncode}; its output is above); "
                f"nothing was added to {into_path.name}"
            )
        written = [path for path in stage_files(dvc_yaml, run_stages) if (scratch / path).is_file()]
        files = {path: (scratch / path).read_bytes() for path in ["params.yaml", "dvc.lock", *written]}
        count = archive.add(into_path, archive.Run(name, run_stages, overrides, files, seconds), args.force)
    print(
        f"run {name}: {', '.join(run_stages)} in {seconds:.0f} s, {len(files)} files; {into_path} holds {count} run(s)"
    )


def add_arguments(parser) -> None:
    parser.add_argument("name", help="the experiment's name at home (letters, digits, . _ -)")
    parser.add_argument(
        "-S",
        "--set-param",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a params.yaml value for this run, as with `dvc exp run -S` (repeatable)",
    )
    parser.add_argument(
        "--stages",
        nargs="+",
        default=["benchmark", "estimate"],
        metavar="STAGE",
        help="the stages to run after `machine`, in order (default: benchmark estimate)",
    )
    parser.add_argument(
        "--into",
        default="runs.tar.gz",
        metavar="FILE",
        help="the runs archive to add this run to (default %(default)s)",
    )
    parser.add_argument("--project", default=".", metavar="DIR", help="the project's root (default: here)")
    parser.add_argument("--force", action="store_true", help="replace a run of the same name in the archive")
