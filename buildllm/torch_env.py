"""Process settings torch reads once, when it is imported: set from the config before anything imports
torch. Commands and the stage scripts that train or measure call this first; the others never import
torch, so they do not depend on it (their DVC deps are their imports)."""

from __future__ import annotations

import os
import sys

from buildllm.config import Config, load_config
from buildllm.errors import guarded

MPS_FALLBACK = "PYTORCH_ENABLE_MPS_FALLBACK"


def before_torch(config: Config) -> Config:
    """PYTORCH_ENABLE_MPS_FALLBACK runs operators MPS lacks on the CPU; torch reads it at import only."""
    if config.mps_fallback and os.environ.get(MPS_FALLBACK) != "1":
        if "torch" in sys.modules:
            print(
                f"warning: mps_fallback asked for after torch was imported; set {MPS_FALLBACK}=1 in the "
                "environment instead",
                file=sys.stderr,
            )
        os.environ[MPS_FALLBACK] = "1"
    return config


def stage_settings(params: str = "params.yaml") -> None:
    """For a stage script that imports torch: call it before importing the stage's function. It runs
    at import, outside run_stage: a bad params.yaml ends here in the same one line and exit code."""
    if code := guarded(lambda: before_torch(load_config(params)) and None):
        sys.exit(code)
