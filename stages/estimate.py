"""DVC stage estimate: project the planned run's time and storage from the benchmark."""

import sys

from buildllm.cli import run_stage
from buildllm.predict.estimate import estimate

sys.exit(run_stage(estimate))
