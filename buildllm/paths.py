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


# One folder per vocabulary under data/tokens/ and tokenizer/: each is the output of its own tokenize
# stage (dvc.yaml foreach over tokenize.vocabularies), which DVC cannot name from the corpus.
def tokenizer_path(config: Config, vocab_size: int) -> Path:
    name = f"{token_set_name(config, vocab_size)}_tokenizer.json"
    return Path(config.train.tokenizer or TOKENIZERS / str(vocab_size) / name)


def token_paths(config: Config, vocab_size: int) -> tuple[Path, Path]:
    folder = DATA / "tokens" / str(vocab_size) / token_set_name(config, vocab_size)
    train = Path(config.train.train_tokens or folder / "train_tokens.pt")
    return train, Path(config.train.validation_tokens or folder / "validation_tokens.pt")


def metrics_path(stage: str) -> Path:
    return METRICS / f"{stage}.json"


def tokenize_metrics_path(vocab_size: int) -> Path:
    """Each vocabulary's own record of its token files (tokens_4096.json): one tokenize stage never
    rewrites another's. (Not tokenize_16384: its summary's path would widen `dvc metrics show` past 160.)"""
    return metrics_path(f"tokens_{vocab_size}")
