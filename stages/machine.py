"""DVC stage machine: metrics/machine.json, the fingerprint of the machine the measurements run on."""

import sys

from buildllm.cli import run_stage
from buildllm.measure.machine import write_machine

sys.exit(run_stage(write_machine))
