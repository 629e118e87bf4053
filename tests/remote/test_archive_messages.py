"""Crafted or broken runs archives, and a run DVC refuses: each says in one line what is wrong and
what to do (buildllm/remote/archive.py, import_runs.py), never a traceback, and changes nothing."""

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

FILES = {"params.yaml": b"seed: 7\n", "dvc.lock": b"schema: '2.0'\nstages: {}\n"}


def tar_gz(path, members: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def with_manifest(path, manifest: bytes, files: dict[str, bytes] = FILES):
    members = {f"{archive.TOP}/manifest.json": manifest}
    members |= {f"{archive.TOP}/one/{name}": data for name, data in files.items()}
    return tar_gz(path, members)


def entry(**changes) -> dict:
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}
    return {"name": "one", "stages": ["machine"], "overrides": [], "files": digests, "seconds": 1.0, **changes}


def manifest(*runs, **changes) -> bytes:
    return json.dumps({"format": archive.FORMAT, "runs": list(runs), **changes}).encode()


CRAFTED = {
    "a number for a run": (manifest(1), "runs[0] is 1, not an object"),
    "not UTF-8": (manifest(entry()).replace(b'"one"', b'"\xff\xfe"'), "not UTF-8 text: byte 0xff"),
    "no name": (manifest({k: v for k, v in entry().items() if k != "name"}), "runs[0] has no allowed name"),
    "no files": (manifest({k: v for k, v in entry().items() if k != "files"}), "has no files object"),
    "stages as a string": (manifest(entry(stages="machine")), "stages is not a list of strings"),
    "seconds as text": (manifest(entry(seconds="fast")), 'seconds is "fast", not a number'),
    "a digest as a number": (manifest(entry(files={"params.yaml": 1, "dvc.lock": 2})), "has no files object"),
    "no format": (json.dumps({"runs": []}).encode(), "format null, where this version reads format 1"),
    "runs as an object": (manifest(runs={}), "no runs list"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_manifest_is_named_malformed_in_one_line(tmp_path, case):
    data, why = CRAFTED[case]
    with pytest.raises(UserError) as refused:
        archive.read(with_manifest(tmp_path / "runs.tar.gz", data))
    message = str(refused.value)
    assert "has a malformed manifest.json" in message and why in message, message
    assert "buildllm pack-run --into FILE" in message and "\n" not in message


@pytest.mark.parametrize(
    "members, why",
    [
        ({"photos/cat.jpg": b"\xff\xd8"}, "no buildllm-runs/manifest.json among its 1 file(s): photos/cat.jpg"),
        ({}, "no buildllm-runs/manifest.json among its 0 file(s): no files"),
    ],
)
def test_a_tar_gz_that_is_no_runs_archive_is_not_told_to_copy_it_again(tmp_path, members, why):
    with pytest.raises(UserError) as refused:
        archive.read(tar_gz(tmp_path / "photos.tar.gz", members))
    message = str(refused.value)
    assert "is not a runs archive" in message and why in message and "copy it again" not in message, message


def test_the_command_says_one_line_for_a_crafted_archive(project, tmp_path):
    path = with_manifest(tmp_path / "runs.tar.gz", manifest(1))
    done = subprocess.run(
        [sys.executable, "-m", "buildllm", "import-runs", str(path)],
        cwd=project,
        env=run_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "malformed manifest.json (runs[0] is 1, not an object)" in done.stderr


def test_a_run_dvc_refuses_is_reported_with_dvcs_own_reason_and_nothing_changes(project, tmp_path):
    (project / ".dvc" / ".gitignore").write_text("/config.local\n/tmp\n/cache\n")  # as `dvc init` commits it
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    subprocess.run(["git", "commit", "-qm", "DVC's .gitignore"], cwd=project, env=run_env(), check=True)
    files = {
        "params.yaml": (project / "params.yaml").read_bytes().replace(b"seed: 1337", b"seed: 7"),
        "dvc.lock": b"schema: '2.0'\nstages: [\n",  # cut short: DVC cannot parse it
        "metrics/machine.json": b"{}\n",
    }
    path = tmp_path / "runs.tar.gz"
    archive.write(path, [archive.Run("one", ["machine"], ["seed=7"], files, 1.0)])
    status = ["git", "status", "--porcelain"]
    before = subprocess.run(status, cwd=project, capture_output=True, text=True).stdout
    done = subprocess.run(
        [sys.executable, "-m", "buildllm", "import-runs", str(path)],
        cwd=project,
        env=run_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "`dvc exp save` refused run one ('./dvc.lock' is invalid." in done.stderr, done.stderr
    assert "no message" not in done.stderr
    assert subprocess.run(status, cwd=project, capture_output=True, text=True).stdout == before
    refs = subprocess.run(["git", "for-each-ref", "refs/exps"], cwd=project, capture_output=True, text=True)
    assert "/one" not in refs.stdout
