"""DVC stage tokenize: train the byte-level BPE and encode the train and validation token tensors.

Not named stages/tokenize.py: the script's folder comes first on sys.path, and a tokenize.py there
would shadow the standard library's tokenize module for every stage script.
"""

import sys

from buildllm.data.tokenization import tokenize_corpus
from buildllm.stage import run_stage

sys.exit(run_stage(tokenize_corpus))
