"""DVC stage tokenize@VOCAB: train the byte-level BPE of that vocabulary (the command line's one
argument, an item of tokenize.vocabularies) and encode the train and validation token tensors.

Not named stages/tokenize.py: the script's folder comes first on sys.path, and a tokenize.py there
would shadow the standard library's tokenize module for every stage script.
"""

import sys

from buildllm.data.tokenization import tokenize_corpus
from buildllm.stage import run_stage

sys.exit(run_stage(tokenize_corpus, {"tokenize.vocab_size": int(sys.argv[1])}))
