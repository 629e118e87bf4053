"""DVC stage benchmark: a bounded measurement of speed, memory and MFU with the train step."""
import sys

from buildllm.cli import run_stage
from buildllm.measure.benchmark import benchmark

sys.exit(run_stage(benchmark))
