"""DVC stage train: train the profile on the token tensors; checkpoints, metrics/train.json, log and PNG."""
import sys

from buildllm.cli import run_stage, stage_settings

stage_settings()  # before torch is imported: PYTORCH_ENABLE_MPS_FALLBACK
from buildllm.train.trainer import train  # noqa: E402

sys.exit(run_stage(train))
