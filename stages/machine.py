"""DVC stage machine: metrics/machine.json, the fingerprint of the machine the measurements run on."""

import sys

from buildllm.measure.machine import write_machine
from buildllm.stage import run_stage

sys.exit(run_stage(write_machine))
