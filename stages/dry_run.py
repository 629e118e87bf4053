"""DVC stage dry_run: plan the run from params.yaml, count parameters, estimate memory."""

import sys

from buildllm.cli import run_stage
from buildllm.predict.dry_run import dry_run

sys.exit(run_stage(dry_run))
