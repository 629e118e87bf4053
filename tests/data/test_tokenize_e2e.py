"""`dvc repro tokenize` in a fresh copy of the project: the real default corpus, then a user's glob."""

import json
import re

import pytest
from conftest import run, use_docs_corpus

from buildllm.data.tokenization import load_tokenizer
from buildllm.data.windows import Windows, load_tokens

COMMON_WORDS = {"the", "of", "and", "in", "is", "a", "to", "was"}


def english_share(text: str) -> float:
    """The share of words that are among the commonest English words: about a fifth of any English prose."""
    words = re.findall(r"[a-z]+", text.lower())
    return sum(word in COMMON_WORDS for word in words) / max(len(words), 1)


@pytest.mark.slow
def test_dvc_repro_tokenize_on_the_default_corpus_and_on_a_glob(project):
    result = run(["dvc", "repro", "tokenize"], project)
    assert "Running stage 'corpus'" in result.stdout and "Running stage 'tokenize'" in result.stdout

    tokenizer = load_tokenizer(project / "tokenizer" / "wiki_vital_4096_tokenizer.json", expected_vocab=4096)
    folder = project / "data" / "tokens" / "wiki_vital_4096"
    train = load_tokens(folder / "train_tokens.pt", vocab_size=4096)
    validation = load_tokens(folder / "validation_tokens.pt", vocab_size=4096)
    metrics = json.loads((project / "metrics" / "tokenize.json").read_text())
    assert metrics["documents"] == 10033 and metrics["vocab_size"] == 4096
    assert (metrics["train_tokens"], metrics["validation_tokens"]) == (train.numel(), validation.numel())
    assert train.numel() > 10 * validation.numel() > 500_000
    assert 3.0 < metrics["bytes_per_token"] < 5.0

    # A validation window, as training will see it, decodes to readable English.
    windows = Windows(validation, sequence_length=128)
    text = tokenizer.decode(windows.example(len(windows) // 2).tolist())
    assert len(text) > 300 and english_share(text) > 0.1, text
    assert "\ufffd" not in text  # whole characters, not broken byte sequences

    assert "didn't change, skipping" in run(["dvc", "repro", "tokenize"], project).stdout

    # A user's own corpus by a glob: the same outputs under the corpus's own name.
    use_docs_corpus(project)
    run(["dvc", "repro", "tokenize"], project)
    load_tokenizer(project / "tokenizer" / "python_docs_4096_tokenizer.json", expected_vocab=4096)
    tokens = load_tokens(project / "data" / "tokens" / "python_docs_4096" / "train_tokens.pt", vocab_size=4096)
    metrics = json.loads((project / "metrics" / "tokenize.json").read_text())
    assert metrics["train_tokens"] == tokens.numel() and metrics["vocab_size"] == 4096
    assert json.loads((project / "metrics" / "corpus.json").read_text())["input_files"] == 60
