"""What every DVC stage script runs its function through: the config from params.yaml alone, and its
user errors reported as the command line reports them (one line, an exit code).

A stage's DVC dependencies are derived from its script's imports (tests/pipeline/test_dvc_deps.py),
so this module imports only the config and the errors' readers: a help text changed in cli.py reruns no stage.
"""

from __future__ import annotations

from buildllm.config import load_config
from buildllm.disk import as_user_error
from buildllm.errors import guarded


def run_stage(function, overrides: dict | None = None) -> int:
    """overrides: what a foreach stage's item sets (tokenize@16384: tokenize.vocab_size 16384)."""
    return guarded(lambda: function(load_config("params.yaml", overrides)) and None, as_user_error)
