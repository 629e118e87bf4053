"""Checkpoints that prove their bytes: any changed byte is found before the file is used, a file
saved before digests loads with a warning, and weights holding NaN make a checkpoint unusable."""

from __future__ import annotations

import random
import shutil
import zipfile

import pytest
import torch
from train_fixtures import damage

from buildllm.train import checkpoint, digest


def real_state(step: int) -> dict:
    """A model and its AdamW state after one step, as a checkpoint holds them (small, but every part)."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 32)).sum().backward()
    optimizer.step()
    return {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "log": [{"loss": 1.0}]}


def test_random_bytes_at_random_offsets_are_found_in_every_trial(tmp_path, capsys):
    """200 seeded trials: half anywhere in the file (mostly tensor data), a quarter in its first 512
    bytes (the archive's first headers and the pickle), a quarter in its last 512 (the central
    directory, the end record and the digest, which uniform draws over 46 kB seldom reach). Every one
    is refused as damaged and the resume falls back to the older intact checkpoint."""
    source = tmp_path / "source"
    checkpoint.save(source, real_state(2), keep=2)
    checkpoint.save(source, real_state(4), keep=2)
    newest = source / checkpoint.checkpoint_name(4)
    rng = random.Random(46)
    missed = []
    for trial in range(200):
        run = tmp_path / f"trial{trial}"
        shutil.copytree(source, run)
        offset, length = damage(run / newest.name, rng, ["anywhere", "anywhere", "start", "end"][trial % 4])
        try:
            checkpoint.load(run / newest.name)
            missed.append((offset, length))
        except checkpoint.DamagedCheckpoint as exc:
            assert exc.condition == "damaged"
        path, state = checkpoint.load_latest(run)
        assert path.name == checkpoint.checkpoint_name(2) and state["step"] == 2
        shutil.rmtree(run)
    assert missed == [], f"{len(missed)} of 200 damaged files loaded: {missed[:5]}"
    assert "is damaged" in capsys.readouterr().err


@pytest.mark.parametrize("from_end", [1, 40, 81, 82, 83, 84, 100])
def test_damage_in_the_digest_record_itself_is_found(tmp_path, from_end):
    """The comment (its 80 bytes), its 2-byte length and the end record before them: changing any of
    them must not make the file look like one saved before digests."""
    _, _, path = checkpoint.save(tmp_path, real_state(2), keep=2)
    data = bytearray(path.read_bytes())
    data[-from_end] ^= 0x5A
    path.write_bytes(bytes(data))
    assert digest.verify(path) is False
    with pytest.raises(checkpoint.DamagedCheckpoint, match="is damaged"):
        checkpoint.load(path)


def test_a_sealed_checkpoint_is_still_a_plain_pytorch_file(tmp_path):
    """The digest is the zip archive's comment: torch.load and zip tools read the file as before."""
    _, _, path = checkpoint.save(tmp_path, real_state(2), keep=2)
    assert digest.verify(path) is True
    assert zipfile.ZipFile(path).comment.startswith(b"buildllm-sha256:")
    plain = torch.load(path, weights_only=True)
    assert plain["step"] == 2 and torch.equal(plain["model"]["0.weight"], real_state(2)["model"]["0.weight"])


def test_a_checkpoint_saved_before_digests_loads_with_one_warning(tmp_path, capsys):
    """Chosen: load it and say so, rather than refuse it: every run trained before would be stranded;
    its weights are still checked."""
    path = tmp_path / checkpoint.checkpoint_name(2)
    torch.save(real_state(2), path)  # as checkpoint.save wrote it before this change
    assert digest.verify(path) is None
    assert checkpoint.load(path)["step"] == 2
    warning = capsys.readouterr().err.strip().splitlines()
    assert warning == [
        f"warning: {path} has no digest (saved before checkpoints carried one), so damage to its bytes cannot "
        "be detected; loading it, its weights checked for NaN and infinity; the next checkpoint saved carries one"
    ]


@pytest.mark.parametrize("part", ["model", "optimizer"])
def test_a_checkpoint_with_nan_weights_is_unusable_and_passed_over(tmp_path, capsys, part):
    checkpoint.save(tmp_path, real_state(2), keep=3)
    broken = real_state(4)
    if part == "model":
        broken["model"]["2.weight"][0, 0] = float("nan")
        where = "weight 2.weight"
    else:
        broken["optimizer"]["state"][1]["exp_avg_sq"][3] = float("inf")
        where = "optimizer state exp_avg_sq of parameter 1"
    _, _, path = checkpoint.save(tmp_path, broken, keep=3)
    assert digest.verify(path) is True  # its bytes are whole: the weights themselves are what is wrong
    with pytest.raises(checkpoint.NonFiniteCheckpoint) as caught:
        checkpoint.load(path)
    assert str(caught.value) == (
        f"checkpoint {path} is unusable (NaN or infinity in {where}); use another checkpoint or rerun into a "
        "fresh --checkpoint-directory"
    )
    assert checkpoint.load_latest(tmp_path)[0].name == checkpoint.checkpoint_name(2)
    assert checkpoint.last_good(tmp_path).name == checkpoint.checkpoint_name(2)
    assert f"{path.name} in {tmp_path} is unusable (NaN or infinity in {where}); trying the one before it" in (
        capsys.readouterr().err
    )


def test_pruning_never_removes_the_checkpoint_just_saved(tmp_path):
    """A resume that passed over a damaged checkpoint of a later step saves below it: keep=1 must keep
    the new, intact file, not the damaged one alone."""
    checkpoint.save(tmp_path, real_state(8), keep=1)
    damage(tmp_path / checkpoint.checkpoint_name(8), random.Random(1))
    checkpoint.save(tmp_path, real_state(6), keep=1)
    assert (tmp_path / checkpoint.checkpoint_name(6)).exists()
    assert checkpoint.last_good(tmp_path).name == checkpoint.checkpoint_name(6)
    assert checkpoint.last_good(tmp_path, weights=False).name == checkpoint.checkpoint_name(6)


def test_a_file_where_the_checkpoint_directory_belongs_is_named(tmp_path):
    (tmp_path / "notes").write_text("mine\n")
    assert checkpoint.file_in_the_way(tmp_path / "notes") == tmp_path / "notes"
    assert checkpoint.file_in_the_way(tmp_path / "notes" / "run") == tmp_path / "notes"
    assert checkpoint.file_in_the_way(tmp_path / "new" / "run") is None
    with pytest.raises(checkpoint.UserError, match=r"lies inside .*notes, which is a file, not a directory"):
        checkpoint.DirectoryLock(tmp_path / "notes" / "run").acquire()
    assert (tmp_path / "notes").read_text() == "mine\n"
