"""Free disk space: the probe a run checks before it starts and a failed save reports with.

A full disk shows up in many guises: OSError ENOSPC from Python, or torch's zip writer failing with
"unexpected pos ..." and the ENOSPC only in the exception's context. Both are recognised here, so a
user reads "disk full" with the figures instead of a traceback.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from buildllm.errors import UserError
from buildllm.units import size

FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DiskFull(UserError):
    """A write that did not fit; what was on disk before it is intact."""

    def __init__(self, folder: str | Path, needed: int, free: int, what: str, advice: str = "", known: bool = True):
        self.folder, self.needed, self.free = Path(folder), int(needed), int(free)
        amount = "about" if known else "more than"
        super().__init__(
            f"disk full: {what} needs {amount} {size(needed)} ({needed:,} bytes) in {folder} but only "
            f"{size(free)} ({free:,} bytes) is free there; "
            + (advice or "free some space or write to another disk, then rerun")
        )


def free_bytes(path: str | Path) -> int:
    """Bytes a non-root user may still write on the filesystem holding `path`, or its nearest
    ancestor that exists (a run's folder may not exist yet)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def is_disk_full(exc: BaseException | None) -> bool:
    """ENOSPC (or a quota) anywhere in the exception's chain: torch wraps it in a RuntimeError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL:
            return True
        exc = exc.__cause__ or exc.__context__
    return False
