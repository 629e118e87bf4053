"""The runs archive: one .tar.gz that carries finished runs from another machine home.

Layout: `buildllm-runs/manifest.json` and, per run, `buildllm-runs/<name>/<path>` for the run's
params.yaml, dvc.lock and the metrics files of the stages it ran. The manifest names each run, the
stages it ran, its `-S` overrides and the sha256 of every file, so a truncated or altered archive
is refused as a whole before anything is written at home. Every write replaces the whole file
atomically: a kill between two runs leaves the archive of the runs finished before it.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from buildllm.atomic import atomic_open
from buildllm.errors import UserError

FORMAT = 1
TOP = "buildllm-runs"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# What a run may carry: the params, the lock and files under metrics/ (nothing that could land elsewhere).
ALLOWED = re.compile(r"^(params\.yaml|dvc\.lock|metrics/[A-Za-z0-9._/-]+)$")


@dataclass
class Run:
    name: str
    stages: list
    overrides: list
    files: dict = field(default_factory=dict)  # relative path -> bytes
    seconds: float | None = None

    def entry(self) -> dict:
        """The run's manifest entry: the files by their sha256, not their bytes."""
        digests = {path: hashlib.sha256(data).hexdigest() for path, data in sorted(self.files.items())}
        return {**asdict(self), "files": digests}


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise UserError(
            f"run name {name!r} is not allowed; use letters, digits, '.', '_' and '-' (at most 100), "
            "starting with a letter or digit"
        )
    return name


def refuse(path: Path, why: str) -> UserError:
    return UserError(
        f"{path} is not a complete runs archive ({why}); nothing was changed: copy it again from the "
        "machine that made it (its runs are added one at a time, so the last good copy holds every "
        "finished run)"
    )


def not_runs(path: Path, why: str) -> UserError:
    return UserError(
        f"{path} is not a runs archive ({why}); nothing was changed: pass the file that `buildllm pack-run "
        "--into FILE` wrote"
    )


def malformed(path: Path, why: str) -> UserError:
    return UserError(
        f"{path} has a malformed manifest.json ({why}): it was not written by `buildllm pack-run` or was "
        "edited; nothing was changed: make the archive again with `buildllm pack-run --into FILE`"
    )


def _entry_problem(index: int, entry) -> str:
    """What is wrong with the manifest's runs[index], "" when nothing is: `buildllm pack-run` writes a
    name, lists of strings for stages and overrides, seconds, and the files by their sha256."""
    where = f"runs[{index}]"
    if not isinstance(entry, dict):
        return f"{where} is {json.dumps(entry)[:40]}, not an object"
    if not isinstance(entry.get("name"), str) or not NAME.match(entry["name"]):
        return f"{where} has no allowed name: {json.dumps(entry.get('name'))[:40]}"
    files = entry.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return f"{where} ({entry['name']}) has no files object of path: sha256"
    for key in ("stages", "overrides"):
        if not isinstance(entry.get(key, []), list) or not all(isinstance(v, str) for v in entry.get(key, [])):
            return f"{where} ({entry['name']}): {key} is not a list of strings"
    seconds = entry.get("seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
        return f"{where} ({entry['name']}): seconds is {json.dumps(seconds)[:40]}, not a number"
    return ""


def _manifest(path: Path, data: bytes) -> dict:
    try:
        manifest = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise malformed(path, f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise malformed(path, f"not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise malformed(path, f"format {json.dumps(found)[:20]}, where this version reads format {FORMAT}")
    if not isinstance(manifest.get("runs"), list):
        raise malformed(path, "no runs list")
    for index, entry in enumerate(manifest["runs"]):
        if problem := _entry_problem(index, entry):
            raise malformed(path, problem)
    return manifest


def read(path: str | Path) -> list[Run]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no runs archive at {path}; pass the file `buildllm pack-run --into` wrote")
    with open(path, "rb") as handle:
        if handle.read(2) != b"\x1f\x8b":  # every .tar.gz starts so; a cut one too
            raise not_runs(path, "not a gzip file")
    try:
        with tarfile.open(path, "r:gz") as archive:
            members = {member.name: archive.extractfile(member).read() for member in archive if member.isfile()}
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise refuse(path, f"{type(exc).__name__}: {str(exc) or 'unreadable'}") from None
    if f"{TOP}/manifest.json" not in members:
        shown = ", ".join(sorted(members)[:2]) or "no files"
        raise not_runs(path, f"no {TOP}/manifest.json among its {len(members)} file(s): {shown}")
    manifest = _manifest(path, members.pop(f"{TOP}/manifest.json"))
    runs, expected = [], set()
    for entry in manifest["runs"]:
        name = entry["name"]
        files = {}
        for relative, digest in entry["files"].items():
            member = f"{TOP}/{name}/{relative}"
            expected.add(member)
            if not ALLOWED.match(relative) or ".." in PurePosixPath(relative).parts:
                raise refuse(path, f"run {name} carries {relative!r}, which a run may not")
            data = members.get(member)
            if data is None:
                raise refuse(path, f"run {name} lacks {relative}")
            if hashlib.sha256(data).hexdigest() != digest:
                raise refuse(path, f"run {name}'s {relative} does not match its checksum")
            files[relative] = data
        if "params.yaml" not in files or "dvc.lock" not in files:
            raise refuse(path, f"run {name} lacks its params.yaml or dvc.lock")
        runs.append(Run(name, entry.get("stages", []), entry.get("overrides", []), files, entry.get("seconds")))
    if extra := sorted(set(members) - expected):
        raise refuse(path, f"{extra[0]} is not in manifest.json")
    if len({r.name for r in runs}) != len(runs):
        raise refuse(path, "two runs share a name")
    return runs


def write(path: str | Path, runs: list[Run]) -> None:
    manifest = {"format": FORMAT, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": [r.entry() for r in runs]}
    members = {f"{TOP}/manifest.json": json.dumps(manifest, indent=1).encode()}
    members |= {f"{TOP}/{run.name}/{relative}": data for run in runs for relative, data in sorted(run.files.items())}
    with atomic_open(path) as handle, tarfile.open(fileobj=handle, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            archive.addfile(info, io.BytesIO(data))


def add(path: str | Path, run: Run, force: bool = False) -> int:
    """Add (or with force replace) one run; returns how many runs the archive now holds."""
    runs = read(path) if Path(path).exists() else []
    if any(r.name == run.name for r in runs) and not force:
        raise UserError(f"{path} already holds a run named {run.name}; choose another name or pass --force")
    runs = [r for r in runs if r.name != run.name] + [run]
    write(path, runs)
    return len(runs)
