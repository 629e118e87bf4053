"""DVC stage estimate: see buildllm/estimate.py."""
import sys

from buildllm.cli import main

sys.exit(main(["estimate"]))
