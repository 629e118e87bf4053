"""DVC stage train: train the profile on the token tensors; checkpoints, metrics/train.json, log and PNG."""

import functools
import sys

from buildllm.stage import run_stage
from buildllm.torch_env import stage_settings

stage_settings()  # before torch is imported: PYTORCH_ENABLE_MPS_FALLBACK
from buildllm.train.loop import train  # noqa: E402

# Under DVC an interrupted run is continued with `buildllm train`, not `dvc repro`: the advice says so.
sys.exit(run_stage(functools.partial(train, under_dvc=True)))
