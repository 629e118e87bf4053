"""File-system faults made real for a test: a small disk that fills, and a read-only folder.

Tests run as root here and often in CI, and root ignores permission bits: a chmod'ed folder stays
writable for it. So as root a read-only folder is a read-only bind mount of the folder onto itself
(writes fail with EROFS, as on a read-only disk); as another user it is chmod 555 (EACCES). Where
neither can be made, the test is skipped, saying why; a fault that was not really made fails it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@contextlib.contextmanager
def small_disk(folder: Path, megabytes: int, files: int | None = None):
    """A tmpfs of `megabytes` (and at most `files` files and folders, itself one) at `folder`, or a skip
    where this machine cannot mount one."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    options = f"size={megabytes}m" + (f",nr_inodes={files}" if files else "")
    mounted = _mount("-t", "tmpfs", "-o", options, f"buildllm-{uuid.uuid4().hex[:8]}", str(folder))
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` (made if missing) read-only while the block runs, its files still readable."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield _really_read_only(folder)
        finally:
            folder.chmod(mode)
        return
    if not shutil.which("mount"):
        pytest.skip("no mount command: as root only a read-only mount makes a folder read-only")
    bound = _mount("--bind", str(folder), str(folder))
    if bound.returncode:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.strip()}")
    try:
        remounted = _mount("-o", "remount,bind,ro", str(folder))
        if remounted.returncode:
            pytest.skip(f"cannot remount read-only here: {remounted.stderr.strip()}")
        yield _really_read_only(folder)
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _really_read_only(folder: Path) -> Path:
    with pytest.raises(OSError):
        (folder / f"probe-{uuid.uuid4().hex[:8]}").touch()
    return folder
