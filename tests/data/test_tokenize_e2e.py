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
    ran = [f"Running stage '{stage}'" in result.stdout for stage in ("corpus", "tokenize@4096", "tokenize@16384")]
    assert all(ran), result.stdout

    tokenizer = load_tokenizer(project / "tokenizer" / "4096" / "wiki_vital_4096_tokenizer.json", expected_vocab=4096)
    folder = project / "data" / "tokens" / "4096" / "wiki_vital_4096"
    train = load_tokens(folder / "train_tokens.pt", vocab_size=4096)
    validation = load_tokens(folder / "validation_tokens.pt", vocab_size=4096)
    metrics = json.loads((project / "metrics" / "tokens_4096.json").read_text())
    assert metrics["documents"] == 10033 and metrics["vocab_size"] == 4096
    assert (metrics["train_tokens"], metrics["validation_tokens"]) == (train.numel(), validation.numel())
    assert train.numel() > 10 * validation.numel() > 500_000
    assert 3.0 < metrics["bytes_per_token"] < 5.0
    # Iterations 2 and 3 find theirs: vocabulary 16384, its own files and record, fewer tokens per text.
    load_tokenizer(project / "tokenizer" / "16384" / "wiki_vital_16384_tokenizer.json", expected_vocab=16384)
    large = json.loads((project / "metrics" / "tokens_16384.json").read_text())
    assert large["vocab_size"] == 16384 and large["documents"] == metrics["documents"]
    assert large["train_tokens"] < metrics["train_tokens"]
    path = project / "data" / "tokens" / "16384" / "wiki_vital_16384" / "train_tokens.pt"
    assert load_tokens(path, vocab_size=16384).numel() == large["train_tokens"]

    # A validation window, as training will see it, decodes to readable English.
    windows = Windows(validation, sequence_length=128)
    text = tokenizer.decode(windows.example(len(windows) // 2).tolist())
    assert len(text) > 300 and english_share(text) > 0.1, text
    assert "\ufffd" not in text  # whole characters, not broken byte sequences

    again = run(["dvc", "repro", "tokenize"], project).stdout
    assert again.count("didn't change, skipping") == 3, again

    # A user's own corpus by a glob: the same outputs under the corpus's own name (its one vocabulary).
    use_docs_corpus(project)
    run(["dvc", "repro", "tokenize"], project)
    load_tokenizer(project / "tokenizer" / "4096" / "python_docs_4096_tokenizer.json", expected_vocab=4096)
    tokens = load_tokens(project / "data" / "tokens" / "4096" / "python_docs_4096" / "train_tokens.pt", vocab_size=4096)
    metrics = json.loads((project / "metrics" / "tokens_4096.json").read_text())
    assert metrics["train_tokens"] == tokens.numel() and metrics["vocab_size"] == 4096
    assert json.loads((project / "metrics" / "corpus.json").read_text())["input_files"] == 60
    assert len(tokenizer.encode(" the function returns").ids) < len(" the function returns")
