"""A checkpoint written in the background holds the state of the step it was taken at, whatever the
steps after it change, stores tied weights once as a plain save does, and its failure is raised
where the trainer waits for it."""

from __future__ import annotations

import zipfile

import pytest
import torch

from buildllm.config import load_config
from buildllm.data.windows import windows_or_random
from buildllm.disk import Unwritable
from buildllm.plan.run_plan import apply_plan, make_plan
from buildllm.train import checkpoint
from buildllm.train.background_save import host_copy
from buildllm.train.trainer import Trainer


def tiny_trainer(directory) -> Trainer:
    plan = make_plan(load_config(None, {"preset": "tiny", "device": "cpu", "train.threads": 1}))
    apply_plan(plan)
    train, _, _ = windows_or_random(plan.config, plan.model, plan.batch_size)
    return Trainer(plan, train, None, directory=directory)


def test_the_host_copy_is_apart_from_training_and_keeps_shared_storage_shared(tmp_path):
    weight = torch.ones(4, 4)
    state = {"model": {"embedding": weight, "head": weight.detach()}, "rows": [{"step": 1}], "step": 1}
    copied = host_copy(state)
    weight.add_(1)  # a later optimizer step, in place
    assert torch.equal(copied["model"]["embedding"], torch.ones(4, 4)) and copied["rows"] == [{"step": 1}]
    embedding, head = copied["model"]["embedding"], copied["model"]["head"]
    assert embedding.untyped_storage().data_ptr() == head.untyped_storage().data_ptr()
    torch.save(copied, tmp_path / "copy.pt")
    with zipfile.ZipFile(tmp_path / "copy.pt") as archive:  # one storage record: the weight written once
        assert sum("/data/" in name for name in archive.namelist()) == 1


def test_a_background_save_holds_its_own_step_while_training_goes_on(tmp_path):
    trainer = tiny_trainer(tmp_path / "run")
    trainer.step()
    weights = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    assert trainer.save_checkpoint(wait=False) == (0.0, 0)
    for _ in range(3):
        trainer.step()  # changes the very tensors the state_dict handed out
    seconds, size = trainer.wait_for_save()
    assert seconds > 0 and size > 0 and trainer.log.saves == [(seconds, size)]
    saved = checkpoint.load(tmp_path / "run" / checkpoint.checkpoint_name(1))
    assert saved["step"] == 1 and saved["cursor"]["batch"] == 1
    assert all(torch.equal(saved["model"][name], value) for name, value in weights.items())
    assert not torch.equal(saved["model"]["lm_head.weight"], trainer.model.state_dict()["lm_head.weight"])
    assert trainer.wait_for_save() == (0.0, 0)  # nothing under way any more


def test_a_failed_background_save_is_raised_where_the_trainer_waits(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    trainer = tiny_trainer(blocker / "run")  # a checkpoint folder that cannot be made
    trainer.step()
    trainer.save_checkpoint(wait=False)
    trainer.step()
    with pytest.raises(Unwritable, match="is a file, not a folder"):  # the save's own one-line refusal
        trainer.wait_for_save()
    assert trainer.log.saves == [] and blocker.read_text() == "not a folder"


def test_a_later_copy_is_written_into_the_last_ones_tensors_and_keeps_them_apart(tmp_path):
    weight, moment = torch.ones(4, 4), torch.zeros(3)
    state = {"model": {"embedding": weight, "head": weight.detach()}, "optimizer": {"m": moment}, "step": 1}
    first = host_copy(state)
    weight.add_(1)
    moment.add_(5)
    second = host_copy({**state, "step": 2}, into=first)
    # The same host tensors, now holding step 2's values; the tie is still one storage.
    assert (
        second["model"]["embedding"] is first["model"]["embedding"]
        and second["optimizer"]["m"] is first["optimizer"]["m"]
    )
    assert torch.equal(second["model"]["head"], torch.full((4, 4), 2.0)) and torch.equal(
        second["optimizer"]["m"], moment
    )
    assert (
        second["model"]["head"].untyped_storage().data_ptr()
        == second["model"]["embedding"].untyped_storage().data_ptr()
    )
    assert second["step"] == 2
    # A tensor whose shape changed gets a fresh copy; two tensors never land in one kept storage.
    grown = host_copy({"model": {"embedding": torch.ones(5, 4), "head": torch.zeros(4, 4)}}, into=first)
    assert grown["model"]["embedding"].shape == (5, 4)
    assert torch.equal(grown["model"]["head"], torch.zeros(4, 4))
    assert grown["model"]["head"].untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()
    untied = host_copy({"model": {"embedding": torch.ones(4, 4), "head": torch.zeros(4, 4)}}, into=first)
    assert torch.equal(untied["model"]["embedding"], torch.ones(4, 4)) and torch.equal(
        untied["model"]["head"], torch.zeros(4, 4)
    )


def test_a_run_keeps_one_host_copy_and_each_checkpoint_holds_its_own_step(tmp_path):
    trainer = tiny_trainer(tmp_path / "run")
    saved_weights = {}
    for step in (1, 2):
        trainer.step()
        saved_weights[step] = {name: value.clone() for name, value in trainer.model.state_dict().items()}
        trainer.save_checkpoint(wait=False)
        trainer.step()  # changes the model while the save is written
    trainer.wait_for_save()
    kept = trainer._host_state["model"]["lm_head.weight"]
    for step, weights in saved_weights.items():
        saved = checkpoint.load(tmp_path / "run" / checkpoint.checkpoint_name(2 * step - 1))
        assert all(torch.equal(saved["model"][name], value) for name, value in weights.items())
    trainer.save_checkpoint(wait=True)
    assert trainer._host_state["model"]["lm_head.weight"] is kept  # written into, not made anew
