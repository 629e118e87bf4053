"""DVC stage report: the run card (plots/run_card.html and .png) and a text sample, after train."""

import sys

from buildllm.cli import run_stage
from buildllm.report.run_card import report

sys.exit(run_stage(report))
