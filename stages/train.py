"""DVC stage train: train the profile on the token tensors; checkpoints, metrics/train.json, log and PNG."""
import sys

from buildllm.cli import main

sys.exit(main(["train"]))
