"""DVC stage corpus: write the configured corpus's train and validation documents to data/corpus/<name>/."""
import sys

from buildllm.cli import main

sys.exit(main(["corpus"]))
