"""The file system's faults as a user reads them: a full disk (with the figures), and a place a write
cannot go (a read-only folder, no permission, a file where a folder must be, or the reverse).

A full disk shows up in many guises: OSError ENOSPC from Python, or torch's zip writer failing with
"unexpected pos ..." and the ENOSPC only in the exception's context. Both are recognised here, so a
user reads "disk full" with the figures instead of a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import tempfile
from pathlib import Path

from buildllm.errors import UserError
from buildllm.units import size

FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# What a file system answers when the place is wrong, not the bytes: read-only, not permitted, a file
# on the way to a folder (EEXIST from mkdir, ENOTDIR below it), a folder where the file must go.
REFUSED = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EEXIST}


class DiskFull(UserError):
    """A write that did not fit; what was on disk before it is intact."""

    def __init__(self, folder: str | Path, needed: int, free: int, what: str, advice: str = "", known: bool = True):
        self.folder, self.needed, self.free = Path(folder), int(needed), int(free)
        amount = "about" if known else "more than"
        room = f"{size(free)} ({free:,} bytes) is free there"
        if no_file_entries(folder):  # a disk of many small files: bytes to spare, but no room for one more file
            said = f"{what} found no room in {folder}: its file system has no file entry (inode) left, though {room}"
        elif needed or known:
            said = f"{what} needs {amount} {size(needed)} ({needed:,} bytes) in {folder} but only {room}"
        else:  # nothing written yet (the folder or the file's name did not fit): no size to say
            said = f"{what} found no room in {folder}: {room}"
        super().__init__(f"disk full: {said}; " + (advice or "free some space or write to another disk, then rerun"))


def existing(path: str | Path) -> Path:
    """`path` or its nearest ancestor that exists (a run's folder may not exist yet)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int:
    """Bytes a non-root user may still write on the filesystem holding `path` (or its nearest ancestor)."""
    return shutil.disk_usage(existing(path)).free


def no_file_entries(path: str | Path) -> bool:
    """Whether the file system holding `path` has no inode left for a new file or folder."""
    try:
        found = os.statvfs(existing(path))
    except OSError:
        return False
    return found.f_files > 0 and found.f_favail == 0


def is_disk_full(exc: BaseException | None) -> bool:
    """ENOSPC (or a quota) anywhere in the exception's chain: torch wraps it in a RuntimeError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Unwritable(UserError):
    """A write the file system refused at its place; nothing was written there."""


def refusal(exc: BaseException, target: str | Path, shown: str | None = None, verb: str = "write") -> Unwritable | None:
    """The one line for an OSError met writing `target` (`shown`: how the line names it), or None when
    it is not a refused place (a bug keeps its traceback). The file system is asked what is in the
    way: the errno alone cannot tell which part of the path is a file."""
    if not isinstance(exc, OSError) or exc.errno not in REFUSED:
        return None
    target = Path(target)
    blocker = next((p for p in target.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        why = f"{blocker} is a file, not a folder; move or rename that file, then rerun"
    elif target.is_file() and exc.errno in (errno.EEXIST, errno.ENOTDIR):  # mkdir of the target itself
        why = f"{target} is a file, not a folder; move or rename that file, then rerun"
    elif target.is_dir() and exc.errno in (errno.EISDIR, errno.EEXIST):
        why = "it is a folder, not a file; move or rename that folder, then rerun"
    elif exc.errno == errno.EROFS:
        why = (
            f"{blocker} is on a read-only file system; remount it read-write, or run from a copy of the "
            "project on a writable disk, then rerun"
        )
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = f"permission denied in {blocker}; make it writable for this user (chmod u+w) or run as its owner"
        why += ", then rerun"
    else:
        return None
    return Unwritable(f"cannot {verb} {shown or target}: {why}")


def as_user_error(exc: BaseException) -> UserError | None:
    """A file-system fault that reached the command line outside the atomic writes (which say it
    better), as one line: a full disk or a refused place at the file the error names; None for any
    other error, which keeps its traceback."""
    if not isinstance(exc, OSError) or not exc.filename:
        return None
    path = Path(os.fsdecode(exc.filename))
    if exc.errno in FULL:
        return DiskFull(path.parent, 0, free_bytes(path.parent), f"writing {path.name}", known=False)
    return refusal(exc, path, verb="use")  # it may have been a read: "use", not "write"


def make_folder(folder: str | Path) -> list[Path]:
    """`mkdir -p folder`, returning the folders it made, outermost first: a write that fails removes
    them again (remove_made), so it leaves no empty folder behind."""
    folder = Path(folder)
    made = list(itertools.takewhile(lambda p: not p.exists(), (folder, *folder.parents)))
    folder.mkdir(parents=True, exist_ok=True)
    return made[::-1]


def remove_made(made: list[Path]) -> None:
    for folder in reversed(made):
        with contextlib.suppress(OSError):  # not empty: another writer has put a file there since
            folder.rmdir()


def probe_writable(folder: str | Path) -> None:
    """Create and remove a file in `folder` (making it if needed, and removing what was made): a long
    run checks its output folders before it starts, not at its first write an hour later. A refused
    place raises Unwritable."""
    folder, made = Path(folder), []
    try:
        made = make_folder(folder)
        fd, name = tempfile.mkstemp(prefix=".buildllm-probe.", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        if exc.errno in FULL:
            raise DiskFull(folder, 0, free_bytes(folder), f"writing into {folder}", known=False) from None
        if (refused := refusal(exc, folder / ".buildllm-probe", f"into {folder}")) is None:
            raise
        raise refused from None
    finally:
        remove_made(made)


def probe_files(paths: list[Path]) -> None:
    """probe_writable for each file's folder, and no folder where one of the files must go: a command
    that writes several files checks them all before it writes the first, so it writes all or none."""
    for folder in dict.fromkeys(Path(path).parent for path in paths):
        probe_writable(folder)
    for path in paths:
        if Path(path).is_dir():
            raise refusal(IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path)), path)
