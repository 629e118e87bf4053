"""DVC stage dry_run: plan the run from params.yaml, count parameters, estimate memory."""
import sys

from buildllm.cli import main

sys.exit(main(["dry-run"]))
