"""A `buildllm` command run as a user runs it, in a folder of its own: written once for every check
that measures by running the product (the paired comparison, `buildllm verify estimate | mfu`).

The folder holds its own params.yaml and metrics/, and links to the project's other entries
(data/, tokenizer/, ...), so the command reads the same token files and writes nothing into the
project. Each command is a fresh `python -m buildllm` process importing this very package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

import buildllm
from buildllm.config import Config, config_to_dict

KEEP_OUT = {"metrics", "params.yaml"}  # each run's own, never the project's


@dataclass(frozen=True)
class Ran:
    returncode: int
    seconds: float  # the command's wall clock, interpreter start included
    stdout: str
    stderr: str

    def last_line(self) -> str:
        return (self.stderr.strip().splitlines() or self.stdout.strip().splitlines() or ["no output"])[-1]


def nested(flat: dict) -> dict:
    """{"train.batch_size": 8} -> {"train": {"batch_size": 8}}; nested keys pass through."""
    tree: dict = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def config_params(config: Config, folder: Path) -> dict:
    """A validated Config as a complete params.yaml for `folder`, its checkpoints kept inside it (a
    run there must never write into the project's checkpoint directory)."""
    params = config_to_dict(config)
    params["train"]["checkpoint_directory"] = str(Path(folder).resolve() / "checkpoints")
    return params


def prepare(folder: Path, params: dict, root: Path | None = None) -> Path:
    """Make `folder` with `params` (flat dotted keys or nested) as its params.yaml, linking every entry
    of `root` (default: the working directory) but its metrics and params."""
    folder, root = Path(folder), Path(root or Path.cwd())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.yaml").write_text(yaml.safe_dump(nested(params), sort_keys=False))
    for entry in root.iterdir():
        link = folder / entry.name
        if entry.name not in KEEP_OUT and not link.exists():
            link.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    return folder


def run_command(folder: Path, arguments: list[str], timeout: float | None = None) -> Ran:
    """`python -m buildllm <arguments> --params params.yaml` in `folder`; raises subprocess.TimeoutExpired."""
    env = dict(os.environ)
    package_root = str(Path(buildllm.__file__).resolve().parents[1])  # this very code, in the child too
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    begin = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "buildllm", *arguments, "--params", "params.yaml"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Ran(done.returncode, time.perf_counter() - begin, done.stdout, done.stderr)


def read_result(folder: Path, stage: str) -> dict:
    return json.loads((Path(folder) / "metrics" / f"{stage}.json").read_text())
