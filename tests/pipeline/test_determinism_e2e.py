"""Real DVC in two fresh copies of the project: the same corpus gives the same tokenizer and token hashes."""

import pytest
import yaml
from conftest import copy_project, run, use_docs_corpus


def lock_hashes(project) -> dict[str, str]:
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    # The cached outputs; metrics/tokens_4096.json holds timings and is not compared.
    return {
        out["path"]: out["md5"]
        for out in lock["stages"]["tokenize@4096"]["outs"]
        if out["path"] in ("tokenizer/4096", "data/tokens/4096")
    }


@pytest.mark.slow
def test_two_fresh_copies_hash_the_tokens_alike(tmp_path):
    hashes = []
    for name in ("first", "second"):
        project = copy_project(tmp_path / name)
        use_docs_corpus(project)  # a small files corpus keeps the real stages short
        run(["dvc", "repro", "tokenize"], project)
        hashes.append(lock_hashes(project))
    assert set(hashes[0]) == {"tokenizer/4096", "data/tokens/4096"}
    assert hashes[0] == hashes[1]
