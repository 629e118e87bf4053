"""Where each stage's files live, derived from the config so every stage agrees."""

from __future__ import annotations

from pathlib import Path

from buildllm.config import Config

DATA = Path("data")
METRICS = Path("metrics")
TOKENIZERS = Path("tokenizer")
TRAIN_LOG_CSV = METRICS / "train_log.csv"  # the training log, one row per log interval
TRAIN_LOG_JSON = METRICS / "train_log.json"  # the same rows for `dvc plots`


def corpus_name(config: Config) -> str:
    return config.corpus.name or config.corpus.source


def corpus_dir(config: Config) -> Path:
    return DATA / "corpus" / corpus_name(config)


def token_set_name(config: Config, vocab_size: int) -> str:
    """A corpus tokenized with one vocabulary: profiles with the same vocab share it."""
    return f"{corpus_name(config)}_{vocab_size}"


def tokenizer_path(config: Config, vocab_size: int) -> Path:
    return Path(config.train.tokenizer or TOKENIZERS / f"{token_set_name(config, vocab_size)}_tokenizer.json")


def token_paths(config: Config, vocab_size: int) -> tuple[Path, Path]:
    folder = DATA / "tokens" / token_set_name(config, vocab_size)
    train = Path(config.train.train_tokens or folder / "train_tokens.pt")
    return train, Path(config.train.validation_tokens or folder / "validation_tokens.pt")


def metrics_path(stage: str) -> Path:
    return METRICS / f"{stage}.json"
