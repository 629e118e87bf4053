"""DVC stage corpus: write the configured corpus's train and validation documents to data/corpus/<name>/."""

import sys

from buildllm.data.corpus import build_corpus
from buildllm.stage import run_stage

sys.exit(run_stage(build_corpus))
