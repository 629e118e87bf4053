"""Atomic file writes: write a temp file beside the target, fsync, rename.

A crash or kill at any moment leaves either the old file or the new one, never half of one.
Writers that record the name they were given (torch.save puts it inside its zip archive) write
through `atomic_open`'s file handle instead: the random temp name must not reach the bytes, or
equal data gives different files and DVC sees a change.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from buildllm import disk


@contextlib.contextmanager
def atomic_path(path: str | Path, needed: int | None = None, advice: str = "") -> Iterator[Path]:
    """Yield a temp path to write; on success it replaces `path`, on failure it is removed, with any
    folder made for it. A write that fails for lack of disk space raises disk.DiskFull (with `needed`,
    the bytes, when the caller knows it); one the file system refuses at its place (read-only, no
    permission, a file where a folder must be, a folder where the file must be) disk.Unwritable."""
    path = Path(path)
    made: list[Path] = []
    try:
        made = disk.make_folder(path.parent)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        disk.remove_made(made)
        raise _fault(exc, path, 0, needed, advice) from None
    os.close(fd)
    tmp = Path(name)
    # mkstemp makes the file private (0600); give it the mode a plain open() would have.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    committing = False
    try:
        yield tmp
        committing = True
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except Exception as exc:
        written = tmp.stat().st_size if tmp.exists() else 0
        tmp.unlink(missing_ok=True)  # first, so the free space reported is what the disk really has
        disk.remove_made(made)
        # The body's own errors are its own (it may read a user's file); only the rename meets the place.
        refused = disk.refusal(exc, path) if committing else None
        if refused is None:
            refused = _fault(exc, path, written, needed, advice)
        if refused is exc:
            raise
        raise refused from None
    finally:
        tmp.unlink(missing_ok=True)


def _fault(exc: Exception, path: Path, written: int, needed: int | None, advice: str) -> Exception:
    """The user's error for a failed write of `path`: a full disk with its figures, a refused place, or
    `exc` itself (a bug, raised with its traceback)."""
    free = disk.free_bytes(path.parent)
    # torch's writer may lose the errno; a save bigger than the free space is a full disk all the same.
    if disk.is_disk_full(exc) or (needed is not None and isinstance(exc, RuntimeError) and free < needed):
        return disk.DiskFull(
            path.parent, max(needed or 0, written), free, f"writing {path.name}", advice, known=needed is not None
        )
    return disk.refusal(exc, path) or exc


@contextlib.contextmanager
def atomic_open(path: str | Path, needed: int | None = None, advice: str = "") -> Iterator[BinaryIO]:
    with atomic_path(path, needed, advice) as tmp, open(tmp, "wb") as handle:
        yield handle


def atomic_write(path: str | Path, write: Callable[[Path], None], needed: int | None = None, advice: str = "") -> None:
    with atomic_path(path, needed, advice) as tmp:
        write(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text), needed=len(text.encode()))


def _fsync_dir(directory: Path) -> None:
    # The rename itself must reach the disk, or a power cut can bring the old name back.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
