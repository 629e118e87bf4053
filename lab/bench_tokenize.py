"""Tokenize-stage throughput beside a bare `tokenizers` encode_batch over the same text, in one run.

    python -m lab.bench_tokenize [--source wiki_vital] [--vocab-size 4096] [--repeats 3]

Builds the corpus and runs the tokenize stage in a temporary folder (the project's data/ is left
alone), then times Tokenizer.encode_batch (and encode_batch_fast, which the stage uses) on the same
documents already in memory, all at once and in the stage's chunks: no file reading, no packing.
Prints characters/second for each and the stage's share of the best bare encode_batch figure (the
goal is >= 0.8). Best of --repeats for each, since other work on a shared machine only ever slows
a run down. Figures, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
from pathlib import Path

from buildllm.config import load_config
from buildllm.data.corpus import SPLITS, build_corpus, read_texts, split_files
from buildllm.data.tokenization import load_tokenizer, output_paths, tokenize_corpus, vocab_size_for


def best_rate(characters: int, run, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return characters / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="wiki_vital", choices=("wiki_vital", "shakespeare"))
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = load_config(None, {"corpus.source": args.source, "tokenize.vocab_size": args.vocab_size})
    home = Path.cwd()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        if args.source == "shakespeare" and (home / "data" / "cache").is_dir():
            Path("data").mkdir()
            os.symlink(home / "data" / "cache", "data/cache")  # reuse the archive downloaded before
        quiet = contextlib.redirect_stdout(io.StringIO())
        with quiet, contextlib.redirect_stderr(io.StringIO()):
            build_corpus(config)
            stage = [tokenize_corpus(config) for _ in range(args.repeats)]
        stage_rate = max(m["characters_per_second"] for m in stage)
        texts = [text for split in SPLITS for text in read_texts(split_files(config)[split])]
        characters = sum(map(len, texts))
        tokenizer = load_tokenizer(output_paths(config, vocab_size_for(config))[0])
        chunk = config.tokenize.encode_chunk
        rates = {}
        for method in ("encode_batch", "encode_batch_fast"):
            encode = getattr(tokenizer, method)
            whole = best_rate(characters, lambda encode=encode: encode(texts, add_special_tokens=False), args.repeats)
            chunked = best_rate(
                characters,
                lambda encode=encode: [
                    encode(texts[i : i + chunk], add_special_tokens=False) for i in range(0, len(texts), chunk)
                ],
                args.repeats,
            )
            rates[method] = (whole, chunked)
        os.chdir(home)
    print(
        f"corpus {args.source}, vocab {args.vocab_size}: {len(texts):,} documents, {characters:,} characters, "
        f"{os.cpu_count()} CPUs, best of {args.repeats}"
    )
    print(f"tokenize stage (read + encode + pack):        {stage_rate:>12,.0f} characters/s")
    for method, (whole, chunked) in rates.items():
        print(f"bare {method + ', all texts at once:':<40}{whole:>12,.0f} characters/s")
        print(f"bare {method + f', {chunk} texts a call:':<40}{chunked:>12,.0f} characters/s")
    bare = max(rates["encode_batch"])
    print(
        f"stage / best bare encode_batch: {stage_rate / bare:.2f} (goal >= 0.80); "
        f"stage / best bare encode_batch_fast: {stage_rate / max(rates['encode_batch_fast']):.2f}"
    )


if __name__ == "__main__":
    main()
