"""The tokenize stage: a byte-level BPE of the asked size, token tensors, metrics, and bad input."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from pydoc_data.topics import topics

import psutil
import pytest
import torch

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.data.corpus import build_corpus, read_texts
from buildllm.data.sources import END_OF_TEXT
from buildllm.data.tokenization import load_tokenizer, output_paths, tokenize_corpus, train_tokenizer, vocab_size_for
from buildllm.data.windows import load_tokens
from buildllm.errors import ConfigError, UserError

VOCAB = 512
TEXTS = [text for _, text in sorted(topics.items()) if text.strip()]


def corpus_config(**overrides):
    return load_config(
        None,
        {
            "corpus.source": "files",
            "corpus.files": ["texts/*.txt"],
            "corpus.validation_percent": 20.0,
            "tokenize.vocab_size": VOCAB,
            **overrides,
        },
    )


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A working folder holding a small files corpus (Python's documentation topics)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()
    for index, text in enumerate(TEXTS[:30]):
        (tmp_path / "texts" / f"topic_{index:02d}.txt").write_text(text)
    build_corpus(corpus_config())
    return tmp_path


def test_bpe_has_the_asked_size_end_of_text_first_and_round_trips():
    tokenizer = train_tokenizer(TEXTS, VOCAB, min_frequency=2)
    assert tokenizer.get_vocab_size() == VOCAB and tokenizer.token_to_id(END_OF_TEXT) == 0
    sample = "The naïve café — 東京 isn't in the corpus,  but\tbytes always encode.\n"
    ids = tokenizer.encode(sample).ids
    assert max(ids) < VOCAB and tokenizer.decode(ids) == sample
    # Merges were learned: common English and Python words take fewer tokens than their bytes.
    assert len(tokenizer.encode(" the function returns").ids) < len(" the function returns")


def test_a_vocabulary_the_corpus_cannot_fill_is_refused():
    with pytest.raises(UserError, match="yields only .* fewer than the vocabulary of 50000"):
        train_tokenizer(TEXTS[:3], 50000, min_frequency=2)


def test_the_profile_names_the_vocabulary():
    assert vocab_size_for(load_config(None)) == 4096
    assert vocab_size_for(load_config(None, {"iteration": 2})) == 16384
    assert vocab_size_for(load_config(None, {"preset": "tiny"})) == 4096
    assert vocab_size_for(load_config(None, {"iteration": 3, "tokenize.vocab_size": 1000})) == 1000


def test_the_stage_never_writes_to_a_tokenizer_given_for_training():
    config = load_config(None, {"train.tokenizer": "mine.json", "train.train_tokens": "mine.pt"})
    tokenizer, train, validation = output_paths(config, 4096)
    assert tokenizer == Path("tokenizer/4096/wiki_vital_4096_tokenizer.json")
    assert train == Path("data/tokens/4096/wiki_vital_4096/train_tokens.pt")
    assert validation == Path("data/tokens/4096/wiki_vital_4096/validation_tokens.pt")


def test_tokenize_writes_tokenizer_tensors_and_flat_metrics(workspace):
    metrics = tokenize_corpus(corpus_config())
    tokenizer_file = workspace / "tokenizer" / str(VOCAB) / f"files_{VOCAB}_tokenizer.json"
    folder = workspace / "data" / "tokens" / str(VOCAB) / f"files_{VOCAB}"
    tokenizer = load_tokenizer(tokenizer_file, expected_vocab=VOCAB)
    end = tokenizer.token_to_id(END_OF_TEXT)
    for split in ("train", "validation"):
        tokens = load_tokens(folder / f"{split}_tokens.pt", vocab_size=VOCAB)
        assert tokens.dtype == torch.uint16 and tokens.dim() == 1
        assert tokens.numel() == metrics[f"{split}_tokens"]
        # Each document is followed by one end-of-text token; decoding between them gives it back.
        assert int((tokens == end).sum()) == metrics[f"{split}_documents"] and int(tokens[-1]) == end
        documents = list(read_texts(workspace / "data" / "corpus" / "files" / f"{split}.jsonl"))
        cut = (tokens == end).nonzero().flatten().tolist()
        first = tokenizer.decode(tokens[: cut[0]].tolist())
        assert first == documents[0]
    assert metrics["documents"] == metrics["train_documents"] + metrics["validation_documents"]
    assert metrics["vocab_size"] == VOCAB and metrics["token_bytes"] == 2
    assert 1.5 < metrics["bytes_per_token"] < 6 and 1.5 < metrics["validation_bytes_per_token"] < 6
    assert metrics["characters_per_second"] > 0 and metrics["seconds"] >= metrics["encode_seconds"]
    saved = json.loads((workspace / "metrics" / f"tokens_{VOCAB}.json").read_text())
    assert saved == metrics and all(isinstance(v, (int, float)) for v in saved.values())
    summary = json.loads((workspace / "metrics" / "summary" / f"tokens_{VOCAB}.json").read_text())
    assert summary == {"tokens": metrics["train_tokens"]}


def test_the_command_leaves_a_vocabulary_of_the_pipeline_to_dvc(workspace, capsys):
    """In a DVC project a vocabulary of tokenize.vocabularies is its tokenize stage's output, which
    the command does not write behind DVC's back; a vocabulary the pipeline does not build, it does."""
    (workspace / "dvc.yaml").write_text("stages: {}\n")
    params = {
        "corpus": {"source": "files", "files": ["texts/*.txt"], "validation_percent": 20.0},
        "tokenize": {"vocab_size": VOCAB, "vocabularies": [4096, VOCAB]},
    }
    (workspace / "params.yaml").write_text(json.dumps(params))
    assert main(["tokenize"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"run `dvc repro tokenize@{VOCAB}` so that DVC records it" in err
    assert not (workspace / "tokenizer").exists() and not (workspace / "metrics" / f"tokens_{VOCAB}.json").exists()
    params["tokenize"]["vocabularies"] = [4096]
    (workspace / "params.yaml").write_text(json.dumps(params))
    assert main(["tokenize"]) == 0
    assert json.loads((workspace / "metrics" / f"tokens_{VOCAB}.json").read_text())["vocab_size"] == VOCAB


def test_the_vocabularies_are_a_list_of_sizes():
    assert load_config(None).tokenize.vocabularies == [4096, 16384]
    for bad, why in (([], "must be a non-empty list"), ([4096, 100], r"vocabularies\[1\]=100 is too small")):
        with pytest.raises(ConfigError, match=why):
            load_config(None, {"tokenize.vocabularies": bad})


def test_load_tokenizer_refuses_another_vocabulary_missing_and_garbage(workspace):
    tokenize_corpus(corpus_config())
    path = workspace / "tokenizer" / str(VOCAB) / f"files_{VOCAB}_tokenizer.json"
    with pytest.raises(UserError, match=f"has {VOCAB} tokens but the model's vocabulary has 4096"):
        load_tokenizer(path, expected_vocab=4096)
    with pytest.raises(UserError, match="does not exist; run `dvc repro tokenize`"):
        load_tokenizer(workspace / "absent.json")
    (workspace / "garbage.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(UserError, match="is not a Hugging Face tokenizers JSON file"):
        load_tokenizer(workspace / "garbage.json")


def test_a_missing_corpus_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["tokenize"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: corpus file data/corpus/wiki_vital/train.jsonl does not exist; run `dvc repro corpus`"
    )
    assert err.count("\n") == 1 and not (tmp_path / "tokenizer").exists()


@pytest.mark.parametrize(
    "damage, fragment",
    [
        ("bad_line", "line 3 is not a corpus document"),
        ("too_small", "fewer than the vocabulary"),
    ],
)
def test_a_failed_run_leaves_the_previous_outputs(workspace, capsys, damage, fragment):
    tokenize_corpus(corpus_config())
    outputs = [
        *workspace.glob("tokenizer/*/*"),
        *workspace.glob("data/tokens/*/*/*"),
        workspace / "metrics" / f"tokens_{VOCAB}.json",
    ]
    before = {p: p.read_bytes() for p in outputs}
    train = workspace / "data" / "corpus" / "files" / "train.jsonl"
    lines = train.read_text().splitlines(keepends=True)
    if damage == "bad_line":
        lines[2] = "{ half a document\n"
        train.write_text("".join(lines))
    else:
        train.write_text(json.dumps({"title": "tiny", "text": "Too little text for 512 tokens."}) + "\n")
    (workspace / "params.yaml").write_text(
        json.dumps(
            {
                "corpus": {"source": "files", "files": ["texts/*.txt"], "validation_percent": 20.0},
                "tokenize": {"vocab_size": VOCAB},
            }
        )
    )
    capsys.readouterr()
    assert main(["tokenize"]) == 2
    last = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    assert last.startswith("error: ") and fragment in last
    assert {p: p.read_bytes() for p in outputs} == before
    assert sorted(p.name for p in (workspace / "data" / "tokens" / str(VOCAB) / f"files_{VOCAB}").iterdir()) == [
        "train_tokens.pt",
        "validation_tokens.pt",
    ]  # no temp file left behind


def test_a_kill_during_tokenize_leaves_the_previous_files_byte_identical(workspace):
    """kill -9 inside a write of the outputs (frozen the moment a temp file appears, killed while it is
    there): every output is still the previous run's, byte for byte, and the next run writes the new
    ones whole. The corpus is split anew in between (30% held out, not 20%): the new outputs differ
    from the old in every file, so a mix would show."""
    tokenize_corpus(corpus_config())
    outputs = sorted(
        p for folder in ("tokenizer", "data/tokens") for p in (workspace / folder).rglob("*") if p.is_file()
    )
    before = {p: p.read_bytes() for p in outputs}
    build_corpus(corpus_config(**{"corpus.validation_percent": 30.0}))
    params = {"corpus": {"source": "files", "files": ["texts/*.txt"], "validation_percent": 30.0}}
    (workspace / "params.yaml").write_text(json.dumps({**params, "tokenize": {"vocab_size": VOCAB}}))

    def temps() -> list[Path]:
        return [p for folder in {p.parent for p in outputs} for p in folder.iterdir() if p.name.endswith(".tmp")]

    killed = False
    for _ in range(5):  # a write lasts milliseconds: a try whose writes all slip between two looks runs again
        process = subprocess.Popen(
            [sys.executable, "-m", "buildllm", "tokenize"],
            cwd=workspace,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        watched = psutil.Process(process.pid)
        try:
            while process.poll() is None and not killed:
                if temps():
                    process.send_signal(signal.SIGSTOP)
                    while watched.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                        time.sleep(0.001)
                    if temps():
                        process.kill()
                        killed = True
                    else:
                        process.send_signal(signal.SIGCONT)
                time.sleep(0.0005)
        finally:
            process.kill()
            process.wait()
        if killed:
            break
        for path, data in before.items():  # a try that finished: back to the previous files
            path.write_bytes(data)
    assert killed, "no try was caught inside a write"
    assert {p: p.read_bytes() for p in outputs} == before
    for temp in temps():  # what kill -9 leaves: the hidden temp file of the write it stopped
        temp.unlink()
    assert main(["tokenize"]) == 0
    after = {p: p.read_bytes() for p in outputs}
    assert all(after[p] != before[p] for p in outputs)
    assert all(load_tokens(p).numel() for p in outputs if p.suffix == ".pt")


def test_rebuilding_the_tokens_gives_the_same_bytes(workspace):
    """Equal inputs, equal files: else DVC sees new data and a comparison calls the budgets unequal."""

    def outputs() -> dict[str, bytes]:
        files = [*workspace.glob("tokenizer/*/*"), *workspace.glob("data/tokens/*/*/*")]
        return {str(p.relative_to(workspace)): p.read_bytes() for p in sorted(files)}

    tokenize_corpus(corpus_config())
    first = outputs()
    # The second build in a fresh process: per-process hash seeds (Python's and the Rust side's)
    # must not reach the files either.
    (workspace / "params.yaml").write_text(
        json.dumps(
            {
                "corpus": {"source": "files", "files": ["texts/*.txt"], "validation_percent": 20.0},
                "tokenize": {"vocab_size": VOCAB},
            }
        )
    )
    for path in workspace.glob("data/tokens/*/*/*"):
        path.unlink()
    subprocess.run([sys.executable, "-m", "buildllm", "tokenize"], cwd=workspace, check=True, capture_output=True)
    second = outputs()
    assert len(first) == 3 and first.keys() == second.keys()
    assert [name for name in first if first[name] != second[name]] == []
    # The temp file's random name never reaches a token file.
    assert all(b".tmp" not in data for name, data in first.items() if name.endswith(".pt"))
