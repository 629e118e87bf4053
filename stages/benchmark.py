"""DVC stage benchmark: a bounded measurement of speed, memory and MFU with the train step."""

import sys

from buildllm.stage import run_stage
from buildllm.torch_env import stage_settings

stage_settings()  # before torch is imported: PYTORCH_ENABLE_MPS_FALLBACK
from buildllm.measure.benchmark import benchmark  # noqa: E402

sys.exit(run_stage(benchmark))
