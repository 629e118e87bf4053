"""Checkpoints that prove their bytes: the SHA-256 of the file torch.save wrote, kept in the file
itself as its zip archive's comment, and checked before the file is loaded.

Inside the file rather than beside it: a checkpoint is renamed into place in one step
(buildllm.atomic), so the file and its digest appear together, are pruned together and are copied
together; no kill leaves one without the other, and the directory holds nothing new. A zip comment
is part of the format, so torch.load and any zip tool read the file as before.

torch.save ends the archive with an end record whose last two bytes (the comment's length) are zero;
the digest is of exactly those bytes. The comment replaces the zero length with its own length and
follows it, so every byte of the file is covered: a changed byte before the comment changes the
digest, one inside the comment or its length spoils the record.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

MARK = b"buildllm-sha256:"
COMMENT = len(MARK) + 64  # the mark and the digest's hex digits
END_RECORD = b"PK\x05\x06"  # a zip archive's end record: 22 bytes, the comment's length its last two
END_BYTES = 22
HEX = re.compile(rb"[0-9a-f]{64}")
CHUNK = 1 << 20


class _Digesting:
    """A write-only file that hashes what passes through it (torch.save writes, it never seeks)."""

    def __init__(self, handle: BinaryIO):
        self.handle, self.hash = handle, hashlib.sha256()

    def write(self, data) -> int:
        self.hash.update(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


@contextlib.contextmanager
def sealing(handle: BinaryIO) -> Iterator[BinaryIO]:
    """Yield a writer over `handle` (a new file, open for writing) for torch.save; once it has
    written a whole archive, append the archive's digest as its comment. On an error nothing is
    appended: the caller's atomic write throws the file away."""
    writer = _Digesting(handle)
    yield writer
    handle.flush()
    handle.seek(-2, os.SEEK_END)
    handle.write(COMMENT.to_bytes(2, "little") + MARK + writer.hash.hexdigest().encode())


def verify(path: Path) -> bool | None:
    """True when `path` holds the bytes that were saved (they match the digest in them); False when
    it does not (a byte differs, or the end that holds the digest is damaged or missing); None when
    it holds no digest at all, as a checkpoint saved before checkpoints carried one."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        if size >= END_BYTES + COMMENT:
            handle.seek(size - END_BYTES - COMMENT)
            tail = handle.read()
            record, mark, saved = tail[:END_BYTES], tail[END_BYTES : END_BYTES + len(MARK)], tail[-64:]
            if record[:4] == END_RECORD and record[-2:] == COMMENT.to_bytes(2, "little") and mark == MARK:
                return HEX.fullmatch(saved) is not None and _digest(handle, size - COMMENT - 2) == saved.decode()
        if size >= END_BYTES:
            handle.seek(size - END_BYTES)
            record = handle.read()
            if record[:4] == END_RECORD and record[-2:] == b"\0\0":
                return None  # a plain archive, as torch.save writes it
    return False


def _digest(handle: BinaryIO, length: int) -> str:
    """The digest of the file as torch.save left it: its first `length` bytes, then a zero comment length."""
    hashed = hashlib.sha256()
    handle.seek(0)
    while length > 0:
        chunk = handle.read(min(CHUNK, length))
        if not chunk:
            break
        hashed.update(chunk)
        length -= len(chunk)
    hashed.update(b"\0\0")
    return hashed.hexdigest()
