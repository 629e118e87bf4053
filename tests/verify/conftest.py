"""Shared by the checks' tests: a params file pointing at the test token files, small and on one thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


@pytest.fixture
def check_params(tokens, workdir) -> Path:
    params = {"preset": "tiny", "device": "cpu",
              "train": {"threads": 1, "batch_size": 16, "validation_examples": 16, "eval_interval": 10,
                        "checkpoint_interval": 20, "log_interval": 5,
                        "train_tokens": str(tokens["train"]), "validation_tokens": str(tokens["validation"]),
                        "tokenizer": str(tokens["tokenizer"])},
              "benchmark": {"warmup_steps": 1, "measured_steps": 4, "intervals": 2}}
    path = workdir / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())
