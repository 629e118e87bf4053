"""DVC stage estimate: project the planned run's time and storage from the benchmark."""

import sys

from buildllm.predict.estimate import estimate
from buildllm.stage import run_stage

sys.exit(run_stage(estimate))
