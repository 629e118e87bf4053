"""The tokenize stage: train a byte-level BPE on the train documents, then encode both splits.

Byte-level: every string has an encoding (no unknown token), and decoding gives the text back. Only
the train split teaches the tokenizer, so the validation text stays unseen by every learned part.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from buildllm import disk
from buildllm.atomic import atomic_open, atomic_path
from buildllm.config import Config, profile_for
from buildllm.data.corpus import SPLITS, count_documents, read_texts, split_files
from buildllm.data.sources import END_OF_TEXT
from buildllm.errors import UserError
from buildllm.metrics import files_of, json_line, write_metrics
from buildllm.paths import corpus_dir, token_paths, token_set_name, tokenize_metrics_path, tokenizer_path

NUMPY_DTYPES = {torch.uint8: np.uint8, torch.uint16: np.uint16, torch.int32: np.int32}


def token_dtype(vocab_size: int) -> torch.dtype:
    """The smallest dtype that holds every token id: halves or quarters the file and its memory."""
    if vocab_size <= 2**8:
        return torch.uint8
    if vocab_size <= 2**16:
        return torch.uint16
    return torch.int32


def vocab_size_for(config: Config) -> int:
    """The vocabulary the tokenizer is trained for: the model's (tokenize.vocab_size, else the profile's)."""
    return profile_for(config).model.vocab_size


def output_paths(config: Config, vocab_size: int) -> tuple[Path, Path, Path]:
    """(tokenizer, train tokens, validation tokens) this stage writes: never the train.tokenizer /
    train.*_tokens files, which name what training *reads*, so a rerun cannot overwrite a user's own."""
    plain = replace(config, train=replace(config.train, tokenizer=None, train_tokens=None, validation_tokens=None))
    return (tokenizer_path(plain, vocab_size), *token_paths(plain, vocab_size))


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2, length: int | None = None
) -> Tokenizer:
    """A byte-level BPE of exactly vocab_size tokens, the end-of-text token first (id 0)."""
    tokenizer = Tokenizer(models.BPE())
    # No prefix space: the text is encoded exactly as written, so decode(encode(x)) == x.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT],
        # All 256 byte symbols from the start, so text unlike the corpus still encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),
    )
    tokenizer.train_from_iterator(texts, trainer, length=length)
    learned = tokenizer.get_vocab_size()
    if learned != vocab_size:
        raise UserError(
            f"the corpus yields only {learned} tokens occurring at least {min_frequency} times, fewer "
            f"than the vocabulary of {vocab_size}; use a larger corpus, lower tokenize.min_frequency, "
            "or a smaller vocabulary (tokenize.vocabularies lists those the pipeline builds)"
        )
    return tokenizer


def load_tokenizer(path: str | Path, expected_vocab: int | None = None) -> Tokenizer:
    path = Path(path)
    if not path.exists():
        raise UserError(
            f"tokenizer {path} does not exist; run `dvc repro tokenize` (or `buildllm tokenize`) "
            "first, or pass an existing file to --tokenizer"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for any malformed file
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise UserError(
            f"tokenizer {path} is not a Hugging Face tokenizers JSON file ({reason}); "
            "re-create it with `buildllm tokenize`"
        ) from None
    size = tokenizer.get_vocab_size()
    if expected_vocab is not None and size != expected_vocab:
        raise UserError(
            f"tokenizer {path} has {size} tokens but the model's vocabulary has {expected_vocab}; "
            f"use the tokenizer made for this profile (`dvc repro tokenize@{expected_vocab}` writes "
            f"tokenizer/{expected_vocab}/<corpus>_{expected_vocab}_tokenizer.json)"
        )
    return tokenizer


def encode_texts(
    tokenizer: Tokenizer, texts: Iterable[str], dtype: torch.dtype, chunk: int, progress: tqdm
) -> tuple[torch.Tensor, dict]:
    """One 1-D tensor: each text's ids followed by the end-of-text id; plus counts for the metrics."""
    end = tokenizer.token_to_id(END_OF_TEXT)
    if end is None:
        raise UserError(
            f"the tokenizer has no {END_OF_TEXT} token to separate documents; train it with `buildllm tokenize`"
        )
    # The fast variant skips character offsets, which nothing here uses (tokenizers >= 0.20).
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    pieces, counts = [], {"documents": 0, "characters": 0, "bytes": 0}
    remaining = iter(texts)
    while batch := list(islice(remaining, chunk)):
        ids: list[int] = []
        for encoding in encode(batch, add_special_tokens=False):
            ids += encoding.ids
            ids.append(end)
        pieces.append(np.array(ids, dtype=NUMPY_DTYPES[dtype]))
        characters = sum(map(len, batch))
        counts["documents"] += len(batch)
        counts["characters"] += characters
        counts["bytes"] += sum(len(text.encode("utf-8")) for text in batch)
        progress.update(characters)
    tokens = torch.from_numpy(np.concatenate(pieces)) if pieces else torch.empty(0, dtype=dtype)
    # Separators are not text: bytes per token measures how well the text itself compresses.
    counts["text_tokens"] = tokens.numel() - counts["documents"]
    return tokens, counts


def tokenize_corpus(config: Config) -> dict:
    started = time.perf_counter()
    vocab_size = vocab_size_for(config)
    sources = split_files(config)
    documents = {}
    for split, path in sources.items():
        if not path.exists():
            raise UserError(f"corpus file {path} does not exist; run `dvc repro corpus` (or `buildllm corpus`) first")
        documents[split] = count_documents(path)
        if documents[split] == 0:
            raise UserError(
                f"corpus file {path} holds no documents; re-create the corpus with "
                "`buildllm corpus` from a source that has text"
            )
    tokenizer_file, *token_files = output_paths(config, vocab_size)
    disk.probe_files([tokenizer_file, *token_files, *files_of(tokenize_metrics_path(vocab_size))])  # all or none, first
    dtype = token_dtype(vocab_size)
    json_line(
        action="tokenize",
        corpus=str(corpus_dir(config)),
        vocab_size=vocab_size,
        min_frequency=config.tokenize.min_frequency,
        token_dtype=str(dtype).removeprefix("torch."),
        **{f"{split}_documents": n for split, n in documents.items()},
        tokenizer=str(tokenizer_file),
        tokens=str(token_files[0].parent),
    )

    texts = tqdm(
        read_texts(sources["train"]),
        total=documents["train"],
        desc="learning BPE merges",
        unit=" documents",
        mininterval=1.0,
        file=sys.stderr,
    )
    tokenizer = train_tokenizer(texts, vocab_size, config.tokenize.min_frequency, length=documents["train"])
    trained = time.perf_counter()

    tensors, metrics = {}, {}
    with tqdm(desc="encoding", unit=" chars", unit_scale=True, mininterval=1.0, file=sys.stderr) as progress:
        for split in SPLITS:
            tensors[split], counts = encode_texts(
                tokenizer, read_texts(sources[split]), dtype, config.tokenize.encode_chunk, progress
            )
            metrics.update({f"{split}_{key}": value for key, value in counts.items()})
            metrics[f"{split}_tokens"] = tensors[split].numel()
            metrics[f"{split}_bytes_per_token"] = round(counts["bytes"] / max(counts["text_tokens"], 1), 4)
    encoded = time.perf_counter()

    # Everything is in memory and checked: only now replace the previous outputs.
    with atomic_path(tokenizer_file) as tmp:
        tokenizer.save(str(tmp))
    for split, path in zip(SPLITS, token_files):
        with atomic_open(path) as handle:
            torch.save(tensors[split], handle)
    finished = time.perf_counter()

    characters = metrics["train_characters"] + metrics["validation_characters"]
    text_tokens = metrics["train_text_tokens"] + metrics["validation_text_tokens"]
    metrics = {
        "vocab_size": vocab_size,
        "documents": metrics["train_documents"] + metrics["validation_documents"],
        "characters": characters,
        **metrics,
        "bytes_per_token": round((metrics["train_bytes"] + metrics["validation_bytes"]) / max(text_tokens, 1), 4),
        "token_bytes": dtype.itemsize,
        "train_seconds": round(trained - started, 3),
        "encode_seconds": round(encoded - trained, 3),
        "seconds": round(finished - started, 3),
        # The encoding pass alone (reading, encoding, packing), comparable across corpus sizes.
        "characters_per_second": round(characters / max(encoded - trained, 1e-9), 1),
    }
    write_metrics(tokenize_metrics_path(vocab_size), metrics)
    print(
        f"tokenized {token_set_name(config, vocab_size)}: {metrics['train_tokens']:,} train and "
        f"{metrics['validation_tokens']:,} validation tokens, {metrics['bytes_per_token']:.2f} bytes per token, "
        f"{metrics['characters_per_second']:,.0f} characters/s; tokenizer {tokenizer_file}"
    )
    return metrics
