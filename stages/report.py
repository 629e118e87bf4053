"""DVC stage report: the run card (plots/run_card.html and .png) and a text sample, after train."""

import sys

from buildllm.report.run_card import report
from buildllm.stage import run_stage

sys.exit(run_stage(report))
