"""DVC stage preflight: the course's "stop and check" table before train; any fail stops the pipeline."""

import sys

from buildllm.predict.preflight import preflight_stage
from buildllm.stage import run_stage

sys.exit(run_stage(preflight_stage))
