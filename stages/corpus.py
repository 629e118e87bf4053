"""DVC stage corpus: write the configured corpus's train and validation documents to data/corpus/<name>/."""

import sys

from buildllm.cli import run_stage
from buildllm.data.corpus import build_corpus

sys.exit(run_stage(build_corpus))
