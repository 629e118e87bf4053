"""File-system faults in the commands that write: a read-only folder, a file where a folder must be (or
a folder where a file must be), a disk with no room. Each ends in one line and exit 2, with nothing
half-written: the old files as they were, no temp file, no folder made for a write that failed.

The faults are real (tests/fs_faults.py): a read-only bind mount as root, chmod otherwise; a tmpfs
with no inode left; a file put where the folder goes.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from fs_faults import read_only, small_disk

from buildllm import disk
from buildllm.atomic import atomic_path, atomic_write_text
from buildllm.cli import main
from buildllm.errors import UserError, guarded
from buildllm.metrics import write_metrics
from buildllm.stage import run_stage

READ_ONLY = "read-only file system" if os.geteuid() == 0 else "permission denied"


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(err: str) -> str:
    """The last line of stderr (progress bars may come first), which must be the only error."""
    assert "Traceback" not in err and err.count("error:") == 1, err
    return err.rstrip("\n").split("\n")[-1]


def test_a_read_only_folder_refuses_a_write_in_one_line_and_keeps_the_old_file(tmp_path):
    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / "train.json").write_text('{"a": 1}\n')
    with read_only(folder):
        with pytest.raises(disk.Unwritable) as caught:
            atomic_write_text(folder / "train.json", '{"a": 2}\n')
    said = str(caught.value)
    assert said.startswith(f"cannot write {folder / 'train.json'}: ") and said.endswith("then rerun")
    assert f"{folder} is on a {READ_ONLY}" in said or f"{READ_ONLY} in {folder}" in said, said
    assert isinstance(caught.value, UserError)
    assert files(folder) == {"train.json": b'{"a": 1}\n'}


@pytest.mark.parametrize("below", ["train.json", "summary/train.json"])
def test_a_file_where_a_folder_must_be_is_named_and_left_alone(tmp_path, below):
    (tmp_path / "metrics").write_text("a file, not a folder")
    with pytest.raises(disk.Unwritable) as caught:
        atomic_write_text(tmp_path / "metrics" / below, "{}\n")
    assert f": {tmp_path / 'metrics'} is a file, not a folder; move or rename that file" in str(caught.value)
    assert (tmp_path / "metrics").read_text() == "a file, not a folder" and os.listdir(tmp_path) == ["metrics"]


def test_a_folder_where_the_file_must_be_is_named_and_no_temp_is_left(tmp_path):
    (tmp_path / "train.json").mkdir()
    (tmp_path / "train.json" / "inside").write_text("kept")
    with pytest.raises(disk.Unwritable, match=r"train.json: it is a folder, not a file; move or rename that folder"):
        atomic_write_text(tmp_path / "train.json", "{}\n")
    assert files(tmp_path) == {"train.json/inside": b"kept"} and os.listdir(tmp_path) == ["train.json"]


def test_a_failed_write_removes_the_folders_it_made_and_only_those(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(UserError):
        with atomic_path(tmp_path / "data" / "corpus" / "mine" / "train.jsonl") as tmp:
            tmp.write_text("half")
            raise UserError("bad input found halfway")
    assert os.listdir(tmp_path) == ["data"] and os.listdir(tmp_path / "data") == []


def test_a_disk_with_no_room_for_a_new_file_says_disk_full(tmp_path):
    with small_disk(tmp_path / "small", 1, files=3) as small:
        (small / "a").touch()
        (small / "b").touch()  # the root folder and two files: no file entry left
        with pytest.raises(OSError):
            (small / "c").touch()
        with pytest.raises(disk.DiskFull) as caught:
            atomic_write_text(small / "metrics" / "train.json", "{}\n")
        assert str(caught.value).startswith(
            f"disk full: writing train.json found no room in {small / 'metrics'}: its file system has no file "
            "entry (inode) left, though 1.0 MiB (1,048,576 bytes) is free there; free some space"
        )
        assert sorted(os.listdir(small)) == ["a", "b"]
        with pytest.raises(disk.DiskFull, match=r"disk full: writing into .*metrics found no room in .*no file entry"):
            write_metrics(small / "metrics" / "train.json", {"a": 1})  # its probe of the folder first


def test_metrics_are_written_all_or_none(tmp_path):
    """benchmark.json has a summary in metrics/summary/: a file there stops the write before the first file."""
    metrics = tmp_path / "metrics"
    write_metrics(metrics / "benchmark.json", {"tokens_per_second": 1.0})
    before = files(metrics)
    (metrics / "summary" / "benchmark.json").unlink()
    (metrics / "summary").rmdir()
    (metrics / "summary").write_text("in the way")
    with pytest.raises(disk.Unwritable, match="summary is a file, not a folder"):
        write_metrics(metrics / "benchmark.json", {"tokens_per_second": 2.0})
    assert json.loads((metrics / "benchmark.json").read_text()) == json.loads(before["benchmark.json"])


def test_a_fault_outside_the_atomic_writes_is_one_line_and_a_bug_keeps_its_traceback(tmp_path, capsys):
    with read_only(tmp_path / "ro") as folder:
        assert guarded(lambda: open(folder / "lock", "w"), disk.as_user_error) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot use {folder / 'lock'}: ") and READ_ONLY in line
    (tmp_path / "run").write_text("a file")  # a folder made outside the atomic writes (a lock's, a cache's)
    assert guarded(lambda: (tmp_path / "run").mkdir(parents=True, exist_ok=True), disk.as_user_error) == 2
    assert one_line(capsys.readouterr().err) == (
        f"error: cannot use {tmp_path / 'run'}: {tmp_path / 'run'} is a file, not a folder; move or rename that "
        "file, then rerun"
    )
    with pytest.raises(OSError) as caught:  # a bad file descriptor is the program's fault: a traceback
        guarded(lambda: os.read(-1, 1), disk.as_user_error)
    assert caught.value.errno == errno.EBADF


def test_the_command_line_and_the_stages_read_such_a_fault_as_one_line(tokens, workdir, capsys):
    (workdir / "run").write_text("a file where the checkpoint directory goes")
    args = run_args(tokens, "train")
    assert main(args) == 2  # train names its checkpoint directory itself, before the lock is made
    assert "run is a file, not a directory" in one_line(capsys.readouterr().err)
    assert (workdir / "run").read_text() == "a file where the checkpoint directory goes"
    assert run_stage(lambda config: (workdir / "run").mkdir()) == 2
    assert "run is a file, not a folder" in one_line(capsys.readouterr().err)


def run_args(tokens, command: str) -> list[str]:
    data = ["--train-tokens", str(tokens["train"]), "--validation-tokens", str(tokens["validation"])]
    small = ["--preset", "tiny", "--device", "cpu", "--threads", "1"]
    return {
        "dry-run": ["dry-run", *small, *data],
        "benchmark": ["benchmark", *small, *data, "--batch-size", "4", "--sequence-length", "32"],
        "train": [
            "train",
            *small,
            *data,
            "--tokenizer",
            str(tokens["tokenizer"]),
            "--training-examples",
            "32",
            "--batch-size",
            "16",
            "--checkpoint-directory",
            "run",
        ],
    }[command]


@pytest.mark.parametrize("command", ["dry-run", "benchmark", "train"])
def test_a_read_only_metrics_folder_is_one_line_and_nothing_is_written(tokens, workdir, capsys, command):
    (workdir / "params.yaml").write_text("benchmark:\n  warmup_steps: 1\n  measured_steps: 2\n  intervals: 1\n")
    (workdir / "metrics").mkdir()
    (workdir / "metrics" / "kept.json").write_text('{"earlier": 1}\n')
    with read_only(workdir / "metrics"):
        code = main(run_args(tokens, command))
    line = one_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("error: cannot write ") and READ_ONLY in line, line
    assert files(workdir / "metrics") == {"kept.json": b'{"earlier": 1}\n'}
    # The run refused before it trained: no checkpoint; and no plot either.
    assert not list(workdir.rglob("checkpoint_*.pt")) and not (workdir / "plots").exists()


def test_a_file_where_the_metrics_folder_must_be_is_one_line(tokens, workdir, capsys):
    (workdir / "metrics").write_text("not a folder")
    assert main(run_args(tokens, "dry-run")) == 2
    line = one_line(capsys.readouterr().err)
    assert line == (
        "error: cannot write into metrics: metrics is a file, not a folder; move or rename that file, then rerun"
    )
    assert (workdir / "metrics").read_text() == "not a folder"


def test_corpus_and_tokenize_refuse_a_read_only_output_before_the_work(workdir, capsys):
    texts = workdir / "texts"
    texts.mkdir()
    from pydoc_data.topics import topics

    for name in sorted(topics)[:20]:
        (texts / f"{name}.txt").write_text(topics[name])
    (workdir / "params.yaml").write_text(
        "preset: tiny\ntokenize:\n  vocab_size: 300\ncorpus:\n  source: files\n  files: ['texts/*.txt']\n"
        "  name: docs\n  validation_percent: 20\n"
    )
    with read_only(workdir / "data"):
        assert main(["corpus"]) == 2
    assert READ_ONLY in one_line(capsys.readouterr().err) and files(workdir / "data") == {}
    assert not (workdir / "metrics").exists()
    assert main(["corpus"]) == 0
    capsys.readouterr()
    corpus = files(workdir / "data")
    with read_only(workdir / "metrics"):  # the last thing tokenize writes: checked before the first
        assert main(["tokenize"]) == 2
    assert READ_ONLY in one_line(capsys.readouterr().err)
    assert files(workdir / "data") == corpus and not (workdir / "tokenizer").exists()
