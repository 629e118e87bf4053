"""The runs archive that carries runs home (buildllm/remote/archive.py) and the refusals of
`buildllm import-runs` and `buildllm pack-run`: a damaged archive is refused in one line and
changes nothing; the whole route, with real DVC on both sides, is rehearsed in
tests/measure/test_benchmark_gpu_check.py."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile

import pytest
from conftest import run_env

from buildllm.errors import UserError
from buildllm.remote import archive
from buildllm.remote.pack_run import parse_overrides, stage_files


def a_run(name="cuda-fp32", **files):
    files = files or {"params.yaml": b"device: cuda\n", "dvc.lock": b"schema: '2.0'\n", "metrics/benchmark.json": b"{}"}
    return archive.Run(name, ["machine", "benchmark"], ["device=cuda"], dict(files), 1.5)


def test_runs_are_added_one_at_a_time_and_read_back_checked(tmp_path):
    path = tmp_path / "runs.tar.gz"
    assert archive.add(path, a_run("one")) == 1
    assert archive.add(path, a_run("two")) == 2
    runs = archive.read(path)
    assert [r.name for r in runs] == ["one", "two"]
    assert runs[1].files["metrics/benchmark.json"] == b"{}" and runs[1].overrides == ["device=cuda"]
    with pytest.raises(UserError, match="already holds a run named one"):
        archive.add(path, a_run("one"))
    assert archive.add(path, a_run("one", **{"params.yaml": b"x: 1\n", "dvc.lock": b""}), force=True) == 2


def damaged(tmp_path, how: str):
    path = tmp_path / "runs.tar.gz"
    archive.write(path, [a_run()])
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(b"not an archive at all")
    else:  # rebuilt with one file changed, or one file added that the manifest does not list
        with tarfile.open(path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
        if how == "altered":
            members[f"{archive.TOP}/cuda-fp32/metrics/benchmark.json"] = b'{"tokens_per_second": 1e9}'
        elif how == "escaping":
            manifest = json.loads(members[f"{archive.TOP}/manifest.json"])
            manifest["runs"][0]["files"]["../outside.txt"] = hashlib.sha256(b"x").hexdigest()
            members[f"{archive.TOP}/manifest.json"] = json.dumps(manifest).encode()
            members[f"{archive.TOP}/cuda-fp32/../outside.txt"] = b"x"
        with tarfile.open(path, "w:gz") as tar:
            for name, content in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return path


@pytest.mark.parametrize("how", ["truncated", "garbage", "altered", "escaping"])
def test_a_damaged_archive_is_refused_as_a_whole(tmp_path, how):
    # Bytes that are no gzip file at all are no runs archive: copying them again would not help.
    said = "is not a runs archive .not a gzip file" if how == "garbage" else "is not a complete runs archive"
    with pytest.raises(UserError, match=said) as refused:
        archive.read(damaged(tmp_path, how))
    assert "\n" not in str(refused.value)


def test_import_of_a_truncated_archive_says_one_line_and_changes_nothing(project, tmp_path):
    path = damaged(tmp_path, "truncated")
    before = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=project, capture_output=True, text=True)
    refs = ["git", "for-each-ref", "refs/exps"]
    done = subprocess.run(
        [sys.executable, "-m", "buildllm", "import-runs", str(path)],
        cwd=project,
        env=run_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "is not a complete runs archive" in done.stderr, done.stderr
    after = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=project, capture_output=True, text=True)
    assert after.stdout == before.stdout
    assert subprocess.run(refs, cwd=project, capture_output=True, text=True).stdout == ""


def test_import_refuses_a_workspace_with_uncommitted_changes(project, tmp_path):
    path = tmp_path / "runs.tar.gz"
    archive.write(path, [a_run()])
    (project / "params.yaml").write_text((project / "params.yaml").read_text() + "# edited\n")
    edited = (project / "params.yaml").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "buildllm", "import-runs", str(path)],
        cwd=project,
        env=run_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "uncommitted changes (params.yaml)" in done.stderr, done.stderr
    assert "record this machine's run first: commit it" in done.stderr and done.stderr.count("\n") == 1
    assert (project / "params.yaml").read_bytes() == edited


def test_pack_run_refuses_a_bad_name_or_value_before_running_anything(project, tmp_path):
    into = tmp_path / "runs.tar.gz"
    for args, message in [
        (["bad/name"], "run name 'bad/name' is not allowed"),
        (["ok", "-S", "train.batch_sise=4"], "batch_sise"),
        (["ok", "-S", "device"], "is not key=value"),
        (["ok", "--stages", "tokenize"], "are not all stages of dvc.yaml after tokenize"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "buildllm", "pack-run", *args, "--into", str(into)],
            cwd=project,
            env=run_env(),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not into.exists()


def test_an_override_that_is_not_yaml_is_one_line_with_where():
    with pytest.raises(UserError) as caught:
        parse_overrides(["train.batch_size=16", "corpus.files=[a.txt"])
    assert str(caught.value) == (
        "-S 'corpus.files=[a.txt': the value is not valid YAML (line 1, column 7 (`[a.txt`): expected ',' or ']', "
        "but got '<stream end>'); quote it to pass it as text"
    )


def test_overrides_read_values_as_dvc_does_and_stage_files_come_from_dvc_yaml():
    assert parse_overrides(["train.batch_size=16", "precision=bf16", "train.workers=null", "train.compile=false"]) == {
        "train.batch_size": 16,
        "precision": "bf16",
        "train.workers": None,
        "train.compile": False,
    }
    dvc_yaml = {
        "stages": {
            "benchmark": {"outs": [{"metrics/benchmark.json": {"cache": False}}, "checkpoints"], "metrics": []},
            "machine": {"outs": ["metrics/machine.json"]},
        }
    }
    assert stage_files(dvc_yaml, ["machine", "benchmark"]) == ["metrics/machine.json", "metrics/benchmark.json"]
