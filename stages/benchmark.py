"""DVC stage benchmark: see buildllm/benchmark.py."""
import sys

from buildllm.cli import main

sys.exit(main(["benchmark"]))
