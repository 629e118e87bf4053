import os

import pytest

from buildllm.atomic import atomic_path, atomic_write_text
from buildllm.metrics import read_metrics, write_metrics


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_new_file_gets_the_usual_permissions(tmp_path):
    atomic_write_text(tmp_path / "a.txt", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o666 & ~umask


def test_metrics_must_be_flat_finite_scalars(tmp_path):
    write_metrics(tmp_path / "m.json", {"a": 1, "b": 2.5, "c": "x", "d": True})
    assert read_metrics(tmp_path / "m.json") == {"a": 1, "b": 2.5, "c": "x", "d": True}
    for bad in ({"nested": {"a": 1}}, {"none": None}, {"nan": float("nan")}):
        with pytest.raises(TypeError):
            write_metrics(tmp_path / "bad.json", bad)
    assert not (tmp_path / "bad.json").exists()


def test_atomic_open_writes_through_a_handle_and_keeps_the_old_file_on_failure(tmp_path):
    from buildllm.atomic import atomic_open

    target = tmp_path / "out.bin"
    with atomic_open(target) as handle:
        handle.write(b"new")
    assert target.read_bytes() == b"new"
    with pytest.raises(RuntimeError):
        with atomic_open(target) as handle:
            handle.write(b"half")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["out.bin"]
