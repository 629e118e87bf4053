"""DVC stage tune: the auto decisions (precision, threads, loss chunk, compile) measured on this machine."""

import sys

from buildllm.stage import run_stage
from buildllm.torch_env import stage_settings

stage_settings()  # before torch is imported: PYTORCH_ENABLE_MPS_FALLBACK
from buildllm.measure.tune import tune  # noqa: E402

sys.exit(run_stage(tune))
