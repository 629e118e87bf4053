"""Checkpoints a kill cannot corrupt, the lock that keeps two runs out of one directory, and the
check that a resume continues the same schedule.

Each checkpoint is one file written atomically (buildllm.atomic): a kill at any moment leaves the
previous checkpoints whole and at most a stray temp file, which the next run removes. Each carries
the digest of its bytes (buildllm/train/digest.py), checked at every load with its weights'
finiteness: a checkpoint that fails either is named and passed over, never resumed from nor called
the last good one.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import socket
import sys
import time
import zipfile
from dataclasses import asdict, replace
from pathlib import Path

import psutil
import torch

from buildllm.atomic import atomic_open
from buildllm.errors import UserError
from buildllm.shape import GPTConfig
from buildllm.train import digest

NAME = re.compile(r"^checkpoint_(\d+)\.pt$")
# What `gelu` computed when a checkpoint was saved: the exact GELU since 2026-12-07 (shape.py). A
# checkpoint without this key holds a model trained with GPT-2's tanh form, now named gelu_tanh.
GELU = "gelu"
GELU_EXACT = "exact"
LOCK = "train.lock"
TEMP = re.compile(r"^\.checkpoint_\d+\.pt\..*\.tmp$")


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:08d}.pt"


def entries(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    return list(directory.iterdir()) if directory.is_dir() else []


def list_checkpoints(directory: str | Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in entries(directory) if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def foreign_files(directory: str | Path) -> list[str]:
    """Entries that are neither checkpoints, the lock nor a save's leftover temp file."""
    return sorted(
        p.name for p in entries(directory) if not (NAME.match(p.name) or TEMP.match(p.name) or p.name == LOCK)
    )


def save(directory: str | Path, state: dict, keep: int) -> tuple[float, int, Path]:
    """Write `state` as checkpoint_<step>.pt, then prune to the newest `keep`. Returns (seconds,
    bytes, path); the seconds include the fsync, the part a user waits for."""
    directory = Path(directory)
    path = directory / checkpoint_name(state["step"])
    previous = list_checkpoints(directory)
    needed = max([state_bytes(state)] + [p.stat().st_size for p in previous[-1:]])
    advice = (
        f"{len(previous)} earlier checkpoint(s) there are intact; free space, lower --keep-checkpoints or use "
        "a --checkpoint-directory on a disk with room, then rerun the same command to resume"
        if previous
        else "nothing was saved; free space or use a --checkpoint-directory on a disk with room, then rerun"
    )
    # Through a file object (buildllm.atomic says why); a full disk then surfaces as ENOSPC.
    started = time.perf_counter()
    with atomic_open(path, needed, advice) as handle, digest.sealing(handle) as sealed:
        torch.save(state, sealed)
    seconds = time.perf_counter() - started
    # Never the file just written: a damaged checkpoint of a later step, passed over by the resume, may sort after it.
    for old in list_checkpoints(directory)[:-keep]:
        if old != path:
            old.unlink(missing_ok=True)
    return seconds, path.stat().st_size, path


def state_bytes(state) -> int:
    """The bytes a checkpoint of `state` takes: its tensors' storage (the rest is kilobytes)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(value) for value in state)
    return 0


class DamagedCheckpoint(UserError):
    """A checkpoint file that does not read, or not as it was saved; `why` says how, in a few words."""

    condition = "damaged"

    def __init__(self, path: Path, why: str):
        self.path, self.why = path, why
        super().__init__(
            f"checkpoint {path} is {self.condition} ({why}); use another checkpoint or rerun into a fresh "
            "--checkpoint-directory"
        )


class NonFiniteCheckpoint(DamagedCheckpoint):
    """Whole bytes, but weights that hold NaN or infinity: no run can continue from them, no text comes of them."""

    condition = "unusable"


def diagnose(path: Path, differs: bool = False) -> str:
    """How a file that torch cannot load (or whose bytes `differ` from their digest) is damaged, from
    its bytes (torch's own message is about its zip reader, or advises loading unsafely, which is
    wrong for a damaged file)."""
    size = path.stat().st_size
    if size == 0:
        return "empty: a save that never wrote anything"
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != b"PK\x03\x04":  # every checkpoint torch.save writes is a zip archive
        return f"not a checkpoint: its {size:,} bytes are not a PyTorch file"
    if not zipfile.is_zipfile(path):
        return f"truncated: {size:,} bytes, the end of the file is missing"
    if differs:
        return "its bytes differ from the SHA-256 digest saved in it"
    return "not a BuildLLM checkpoint: it holds objects other than tensors and plain values"


def load(path: str | Path) -> dict:
    """The state saved in `path`, once its bytes match their digest and its weights are finite;
    DamagedCheckpoint otherwise. A file saved before checkpoints carried a digest loads with a
    warning: refusing it would strand every run trained before, and its weights are still checked."""
    path = Path(path)
    intact = digest.verify(path)
    if intact is False:
        raise DamagedCheckpoint(path, diagnose(path, differs=True))
    try:
        # weights_only: tensors and plain containers only; a checkpoint cannot run code when loaded.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception:  # torch raises many types for a damaged file
        raise DamagedCheckpoint(path, diagnose(path)) from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict) or "step" not in state:
        raise DamagedCheckpoint(path, "not a BuildLLM checkpoint: it has no model weights or step")
    if where := non_finite(state):
        raise NonFiniteCheckpoint(path, f"NaN or infinity in {where}")
    if intact is None:
        print(
            f"warning: {path} has no digest (saved before checkpoints carried one), so damage to its bytes "
            "cannot be detected; loading it, its weights checked for NaN and infinity; the next checkpoint "
            "saved carries one",
            file=sys.stderr,
        )
    return state


def non_finite(state: dict) -> str:
    """The first weight or optimizer tensor in `state` holding NaN or infinity, by name; "" when none does."""
    tensors = [(f"weight {name}", value) for name, value in state["model"].items()]
    moments = state.get("optimizer", {}).get("state", {}) if isinstance(state.get("optimizer"), dict) else {}
    for index, values in moments.items() if isinstance(moments, dict) else ():
        if isinstance(values, dict):
            tensors += [(f"optimizer state {key} of parameter {index}", value) for key, value in values.items()]
    for name, value in tensors:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            # The least and greatest values are NaN if any value is, infinite if any is: one pass and no
            # mask the tensor's size (isfinite().all() took 20x longer on a 2-core CPU).
            low, high = value.aminmax()
            if not (math.isfinite(low.item()) and math.isfinite(high.item())):
                return name
    return ""


def load_latest(directory: str | Path) -> tuple[Path, dict] | None:
    """The newest checkpoint that reads; a damaged newest one falls back to the one before it."""
    found = list_checkpoints(directory)
    for index, path in reversed(list(enumerate(found))):
        try:
            return path, load(path)
        except DamagedCheckpoint as exc:
            before = f"trying the one before it, {found[index - 1].name}"
            then = before if index else "no earlier checkpoint is left to resume from"
            print(f"warning: {path.name} in {path.parent} is {exc.condition} ({exc.why}); {then}", file=sys.stderr)
    return None


def last_good(directory: str | Path, weights: bool = True) -> Path | None:
    """The newest checkpoint in `directory` whose bytes are intact and, with `weights`, whose weights
    are finite (a full load); the ones passed over are named on stderr. Without `weights` only the
    digest is read: after running out of memory, a load could run out again."""
    if weights:
        found = load_latest(directory)
        return found[0] if found else None
    for path in reversed(list_checkpoints(directory)):
        if digest.verify(path) is not False:
            return path
        print(f"warning: {path.name} in {path.parent} is damaged ({diagnose(path, differs=True)})", file=sys.stderr)
    return None


def file_in_the_way(directory: str | Path) -> Path | None:
    """The file that stands where a checkpoint directory should be: the path itself or a folder above it."""
    directory = Path(directory)
    return next((part for part in (directory, *directory.parents) if part.exists() and not part.is_dir()), None)


def refuse_a_file(directory: str | Path) -> None:
    """A checkpoint directory that is a file, or lies under one, refused in one line before anything is written."""
    if (blocker := file_in_the_way(directory)) is not None:
        what = "is a file" if blocker == Path(directory) else f"lies inside {blocker}, which is a file"
        raise UserError(
            f"--checkpoint-directory {directory} {what}, not a directory: a run saves its checkpoints as files "
            "inside a directory of its own; pass a path that is a directory or does not exist yet, or move that "
            "file away"
        )


def saved_model(state: dict) -> GPTConfig:
    """The model a checkpoint holds. A model field added since (the architecture knobs) reads as its
    default; a `gelu` model saved before `gelu` meant the exact form reads as gelu_tanh, as it was trained."""
    model = GPTConfig(**state["model_config"])
    if state.get(GELU) != GELU_EXACT and model.mlp_activation == "gelu":
        model = replace(model, activation="gelu_tanh")
    return model


def saved_signature(state: dict) -> dict:
    """The signature a checkpoint was saved with, its model's fields as saved_model reads them."""
    model = asdict(saved_model(state)) if "model_config" in state else {}
    return {**state.get("signature", {}), **{f"model.{key}": value for key, value in model.items()}}


def differences(saved: dict, current: dict) -> list[str]:
    keys = sorted(set(saved) | set(current))
    return [f"{key} {saved.get(key)!r} -> {current.get(key)!r}" for key in keys if saved.get(key) != current.get(key)]


def state_to_resume(directory: Path, signature: dict, resume: bool, force: bool) -> dict | None:
    """The checkpoint a run in `directory` continues from; None for a new run. The newest checkpoint
    of the same run is resumed without being asked; a different schedule only with `force`, a
    different model never; a new run into a directory holding anything else is refused, so nothing
    is mixed up or overwritten."""
    stray = [path for path in entries(directory) if TEMP.match(path.name)]
    for path in stray:
        path.unlink(missing_ok=True)
    if stray:
        print(f"warning: removed {len(stray)} temp file(s) of a checkpoint save that was interrupted", file=sys.stderr)
    found = load_latest(directory)
    if found is None:
        if found := list_checkpoints(directory):
            raise UserError(
                f"none of the {len(found)} checkpoint(s) in {directory} is intact (each is named above) and "
                "all are left as they are; rerun into a fresh --checkpoint-directory"
            )
        if foreign := foreign_files(directory):
            raise UserError(
                f"checkpoint directory {directory} is not empty ({', '.join(foreign[:3])}) and holds no "
                "checkpoint; a new run needs an empty or new --checkpoint-directory"
            )
        if resume:
            raise UserError(
                f"--resume given but {directory} holds no checkpoint; drop --resume to start a new run, "
                "or point --checkpoint-directory at the run to continue"
            )
        return None
    path, state = found
    saved = saved_signature(state)
    changed = differences(saved, signature)
    if any(change.startswith(("model.", "profile ")) for change in changed):
        held = saved.get("model.activation")
        if held and changed == [f"model.activation {held!r} -> None"]:
            # Only the activation differs, and this run asked for the profile's own: the old `gelu`
            # checkpoints, or a knob left out. Naming it continues the run.
            raise UserError(
                f"{path} holds a model whose MLP computes {held}, and this run the profile's own activation; "
                f"to continue it, add --activation {held} (params.yaml: model.activation: {held})"
            )
        raise UserError(
            f"{path} holds a different model ({'; '.join(changed)}); its weights cannot continue this "
            "model, even with --force; use a fresh --checkpoint-directory"
        )
    if changed and not force:
        raise UserError(
            f"{path} is a run with a different schedule ({'; '.join(changed)}); rerun from a fresh "
            "--checkpoint-directory unless deliberately resuming an identical schedule, or add --force "
            "to continue it with the new settings"
        )
    if changed:
        print(f"warning: --force: continuing {path} with a different schedule: {'; '.join(changed)}", file=sys.stderr)
    print(f"resuming from {path} (step {state['step']})", file=sys.stderr)
    return state


def start_over(directory: Path, resume: bool) -> None:
    """The DVC train stage's new run: DVC keeps its outputs (persist), so a stage that fails its checks
    leaves the trained model; this clears the directory (not the lock) once they have passed."""
    if resume:
        raise UserError(
            "train.resume is true, but `dvc repro train` starts a new run; to continue the run in "
            f"{directory}, run `buildllm train` with the same params.yaml, then `dvc commit train`"
        )
    for path in entries(directory):
        if path.name != LOCK:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


class DirectoryLock:
    """A lock file naming the owner's pid: a second run on the same directory is refused while the
    first lives; a lock left by a dead process (kill -9, power cut) is taken over with a warning."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / LOCK
        self.held = False

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _mine(self) -> str:
        me = psutil.Process()
        return f"{me.pid} {me.create_time():.3f} {socket.gethostname()}\n"

    def acquire(self) -> None:
        refuse_a_file(self.path.parent)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(self._mine())
            self.held = True
            return
        raise UserError(f"could not take the lock {self.path}; another run keeps taking it; try again")

    def _take_over_if_stale(self) -> None:
        pid, _, host = _owner(self.path)
        if holder := lock_holder(self.path.parent):
            # Another host's run cannot be checked from here: only its owner knows it is gone.
            elsewhere = host and host != socket.gethostname()
            gone = f"; if that run is gone, delete {self.path} and rerun" if elsewhere else ""
            raise UserError(
                f"checkpoint directory {self.path.parent} in use by {holder}; wait for that run to "
                f"finish or stop it, or use another --checkpoint-directory{gone}"
            )
        print(f"warning: taking over the stale lock {self.path} (pid {pid} is no longer running)", file=sys.stderr)
        self.path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.held:
            with contextlib.suppress(OSError):
                if self.path.read_text() == self._mine():
                    self.path.unlink()
            self.held = False


def lock_holder(directory: str | Path) -> str:
    """Who holds `directory`'s lock, if a live run (or another host) does; "" when it is free. Reads only."""
    pid, started, host = _owner(Path(directory) / LOCK)
    if pid is None:
        return ""
    if host and host != socket.gethostname():
        return f"pid {pid} on host {host}"
    return f"pid {pid}" if _alive(pid, started) else ""


def _owner(path: Path) -> tuple[int | None, str, str]:
    """(pid, start time, host) as a lock file names them; (None, "", "") when it does not read."""
    try:
        pid_text, started, host = (path.read_text().split() + ["", "", ""])[:3]
        return int(pid_text), started, host
    except (OSError, ValueError):
        return None, "", ""


def _alive(pid: int, started: str) -> bool:
    """The pid runs and is the same process (pids are reused: compare start times too)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return not started or abs(process.create_time() - float(started)) < 1.0
    except psutil.AccessDenied:
        return True  # it exists; someone else's process
    except (psutil.NoSuchProcess, ValueError):
        return False
