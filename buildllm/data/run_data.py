"""What a training run reads: its training and validation windows and the tokenizer it records,
found from the config (buildllm/paths.py) and checked before anything is built."""

from __future__ import annotations

from pathlib import Path

from buildllm.config import Config
from buildllm.data.tokenization import load_tokenizer
from buildllm.data.windows import Windows, load_windows
from buildllm.paths import tokenizer_path
from buildllm.shape import GPTConfig


def load_run_data(config: Config, model: GPTConfig) -> tuple[Windows, Windows, Path]:
    """(training windows, validation windows, tokenizer path). A tokenizer made for another
    vocabulary is refused now; a run may go without one (the path is recorded either way)."""
    tokenizer = tokenizer_path(config, model.vocab_size)
    train, validation = load_windows(config, model)
    if tokenizer.exists() or config.train.tokenizer:
        load_tokenizer(tokenizer, model.vocab_size)
    return train, validation, tokenizer
