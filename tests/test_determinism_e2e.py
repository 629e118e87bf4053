"""Real DVC in two fresh copies of the project: the same corpus gives the same tokenizer and token hashes."""

import pytest
import yaml
from pydoc_data.topics import topics

from conftest import copy_project, run


def lock_hashes(project) -> dict[str, str]:
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    # The cached outputs; metrics/tokenize.json holds timings and is not compared.
    return {out["path"]: out["md5"] for out in lock["stages"]["tokenize"]["outs"]
            if out["path"] in ("tokenizer", "data/tokens")}


@pytest.mark.slow
def test_two_fresh_copies_hash_the_tokens_alike(tmp_path):
    hashes = []
    for name in ("first", "second"):
        project = copy_project(tmp_path / name)
        # A small files corpus (Python's documentation topics) keeps the real stages short.
        (project / "my_texts").mkdir()
        for title in sorted(topics)[:60]:
            (project / "my_texts" / f"{title}.txt").write_text(topics[title])
        params = yaml.safe_load((project / "params.yaml").read_text())
        params["corpus"].update(source="files", files=["my_texts/*.txt"], name="python_docs")
        (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        run(["dvc", "repro", "tokenize"], project)
        hashes.append(lock_hashes(project))
    assert set(hashes[0]) == {"tokenizer", "data/tokens"}
    assert hashes[0] == hashes[1]
