"""`buildllm tokenize`: the tokenize stage's work, less what is DVC's to write.

A vocabulary in tokenize.vocabularies is the output of its own tokenize stage (dvc.yaml foreach): its
lock entry holds the files' hashes, and experiments compare them. Written here, it would change a
stage's tracked output behind DVC's back (its record, its token files). Kept out of the stage's
module, so the stages do not depend on tokenize.vocabularies: adding a vocabulary reruns none.
"""

from __future__ import annotations

from pathlib import Path

from buildllm.config import Config
from buildllm.data.tokenization import tokenize_corpus, vocab_size_for
from buildllm.errors import UserError


def tokenize_command(config: Config) -> dict:
    vocab_size = vocab_size_for(config)
    if Path("dvc.yaml").is_file() and vocab_size in config.tokenize.vocabularies:
        raise UserError(
            f"vocabulary {vocab_size} is an output of this project's pipeline (tokenize.vocabularies); "
            f"run `dvc repro tokenize@{vocab_size}` so that DVC records it, or list another vocabulary"
        )
    return tokenize_corpus(config)
