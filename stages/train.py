"""DVC stage train: train the profile on the token tensors; checkpoints, metrics/train.json, log and PNG."""
import sys

from buildllm.cli import run_stage
from buildllm.train.trainer import train

sys.exit(run_stage(train))
