"""DVC stage dry_run: plan the run from params.yaml, count parameters, estimate memory."""

import sys

from buildllm.predict.dry_run import dry_run
from buildllm.stage import run_stage

sys.exit(run_stage(dry_run))
