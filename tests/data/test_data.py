"""The data module: token file checks, windows, deterministic resumable order, worker loading."""

import itertools

import pytest
import torch

from buildllm.cli import main
from buildllm.data.tokenization import token_dtype
from buildllm.data.windows import RunBatches, Windows, epoch_order, load_tokens, loader, sequential_batches
from buildllm.errors import UserError
from buildllm.train.distributed import World
from buildllm.train.trainer import DataCursor


def save(tmp_path, value, name="tokens.pt"):
    path = tmp_path / name
    torch.save(value, path)
    return path


def test_token_dtype_is_the_smallest_that_holds_the_vocabulary():
    assert token_dtype(256) == torch.uint8
    assert token_dtype(257) == torch.uint16 and token_dtype(16384) == torch.uint16
    assert token_dtype(65537) == torch.int32


def test_load_tokens_accepts_a_small_dtype_and_checks_the_vocabulary(tmp_path):
    path = save(tmp_path, torch.tensor([0, 5, 4095], dtype=torch.uint16))
    assert load_tokens(path, vocab_size=4096).tolist() == [0, 5, 4095]
    with pytest.raises(UserError, match="holds token id 4095 but the model's vocabulary has 4000"):
        load_tokens(path, vocab_size=4000)


@pytest.mark.parametrize(
    "value, fragment",
    [
        (torch.zeros(4, 4, dtype=torch.int64), "must be a 1-D integer tensor, got shape (4, 4)"),
        (torch.zeros(8), "must be a 1-D integer tensor, got shape (8,) dtype torch.float32"),
        ({"tokens": [1, 2]}, "must be a 1-D integer tensor, got shape dict"),
        (torch.zeros(0, dtype=torch.int64), "is empty"),
    ],
)
def test_load_tokens_refuses_what_is_not_a_token_file(tmp_path, value, fragment):
    with pytest.raises(UserError) as excinfo:
        load_tokens(save(tmp_path, value))
    assert fragment in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_load_tokens_refuses_missing_and_garbage_files(tmp_path):
    with pytest.raises(UserError, match="does not exist; run `dvc repro tokenize`"):
        load_tokens(tmp_path / "absent.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a tensor")
    with pytest.raises(UserError, match="is not a saved torch tensor"):
        load_tokens(garbage)


def test_windows_are_consecutive_and_never_cross_the_end():
    tokens = torch.arange(23).to(torch.uint16)
    windows = Windows(tokens, sequence_length=5)
    assert len(windows) == 4  # (23 - 1) // 5: the last window ends at token 20, not past 22
    inputs, targets = windows.batch(range(len(windows)))
    assert inputs.dtype == torch.int64 and inputs.shape == (4, 5)
    assert torch.equal(targets[:, :-1], inputs[:, 1:])
    assert inputs[1].tolist() == [5, 6, 7, 8, 9] and targets[3].tolist() == [16, 17, 18, 19, 20]
    # One buffer for both halves, each contiguous: one pinned copy to a device, no strided views.
    pair = windows.pair(range(len(windows)))
    assert pair.is_contiguous() and pair.shape == (2, 4, 5)
    assert torch.equal(pair[0], inputs) and torch.equal(pair[1], targets)
    assert len(Windows(tokens, 5, limit=2)) == 2 and len(Windows(tokens, 5, limit=100)) == 4


def test_fewer_tokens_than_one_example_is_a_clear_error():
    with pytest.raises(UserError, match="5 tokens are fewer than one example of 6 tokens"):
        Windows(torch.arange(5), sequence_length=5)


@pytest.mark.parametrize("command", ["train", "dry-run"])
def test_a_validation_file_too_short_for_one_example_is_named_and_the_dry_run_refuses_it_too(
    tokens, workdir, capsys, command
):
    count = load_tokens(tokens["validation"]).numel()  # the training file holds ten times more
    args = ["--preset", "tiny", "--device", "cpu", "--threads", "1", "--batch-size", "1", "--sequence-length"]
    files = ["--train-tokens", str(tokens["train"]), "--validation-tokens", str(tokens["validation"])]
    assert main([command, *args, str(count), *files]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"error: the validation token file {tokens['validation']} holds {count:,} tokens, fewer than one example "
        f"of {count + 1:,} tokens (sequence_length {count:,} and the token after it); lower --sequence-length "
        f"(model.sequence_length) to at most {count - 1:,}, or raise corpus.validation_percent and rerun corpus "
        "and tokenize, or pass a larger --validation-tokens file"
    ]
    assert "fits" not in out and not (workdir / "metrics").exists()
    assert main(["dry-run", *args, str(count - 1), *files]) == 0  # the length it names does give one example
    assert "memory: fits" in capsys.readouterr().out


def test_epoch_order_depends_only_on_seed_and_epoch():
    assert torch.equal(epoch_order(50, seed=1, epoch=0), epoch_order(50, seed=1, epoch=0))
    assert not torch.equal(epoch_order(50, seed=1, epoch=0), epoch_order(50, seed=1, epoch=1))
    assert not torch.equal(epoch_order(50, seed=1, epoch=0), epoch_order(50, seed=2, epoch=0))
    assert sorted(epoch_order(50, 1, 0).tolist()) == list(range(50))


def test_a_resumed_epoch_continues_with_the_same_batches():
    windows = Windows(torch.arange(400), sequence_length=7)
    per_epoch = len(windows) // 4
    full = list(itertools.islice(RunBatches(windows, batch_size=4, seed=3, epoch=2), per_epoch + 3))
    resumed = list(itertools.islice(RunBatches(windows, batch_size=4, seed=3, epoch=2, start_batch=5), per_epoch - 2))
    assert [b[:2] for b in resumed] == [(2, i) for i in range(5, per_epoch)] + [(3, 0), (3, 1), (3, 2)]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(full[5:], resumed, strict=True))


def test_ranks_together_see_what_one_process_sees_with_the_larger_batch():
    windows = Windows(torch.arange(400), sequence_length=7)
    single = list(itertools.islice(RunBatches(windows, batch_size=6, seed=0, epoch=0), 20))  # two epochs and more
    ranks = [
        list(itertools.islice(RunBatches(windows, batch_size=3, seed=0, epoch=0, rank=r, world_size=2), 20))
        for r in (0, 1)
    ]
    for one, (left, right) in zip(single, zip(*ranks)):
        assert one[:2] == left[:2] == right[:2] and torch.equal(one[2], torch.cat([left[2], right[2]], dim=1))


def test_loader_with_workers_gives_the_same_batches_in_the_same_order_across_epochs():
    windows = Windows(torch.arange(3000).to(torch.uint16), sequence_length=16, limit=150)
    per_epoch = 150 // 8
    count = 2 * per_epoch + 4  # the rest of epoch 1 from batch 3, all of epoch 2, the start of epoch 3
    plain = list(itertools.islice(loader(RunBatches(windows, batch_size=8, seed=5, epoch=1, start_batch=3)), count))
    workers = list(
        itertools.islice(
            loader(RunBatches(windows, batch_size=8, seed=5, epoch=1, start_batch=3), workers=2, pin_memory=True), count
        )
    )
    # The reference, from the epochs' orders alone: 8 examples of each epoch's permutation per batch.
    expected = [
        (e, i, windows.pair(epoch_order(len(windows), 5, e)[i * 8 : (i + 1) * 8]))
        for e in (1, 2, 3)
        for i in range(3 if e == 1 else 0, per_epoch)
    ]
    for (e, i, x), (f, j, u), (g, k, s) in zip(plain, workers, expected[:count], strict=True):
        assert e == f == g and i == j == k and isinstance(j, int) and isinstance(f, int)
        assert torch.equal(x, u) and torch.equal(x, s)
    assert [e for e, *_ in plain].count(2) == per_epoch


def test_workers_started_by_a_forkserver_give_the_same_batches():
    """CUDA's context: workers forked by a fresh server, not by the trainer (Device.worker_context)."""
    windows = Windows(torch.arange(3000).to(torch.uint16), sequence_length=16, limit=150)
    batches = lambda: RunBatches(windows, batch_size=8, seed=5, epoch=0, start_batch=2)  # noqa: E731
    plain = list(itertools.islice(loader(batches()), 6))
    served = list(itertools.islice(loader(batches(), workers=2, context="forkserver"), 6))
    assert [tuple(b[:2]) for b in served] == [b[:2] for b in plain]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(plain, served, strict=True))


def test_workers_start_once_for_a_run_of_several_epochs(monkeypatch):
    """The measured windows hold no worker start-up: one DataLoader (so one set of worker processes)
    serves every epoch, however short. A loader per epoch, as before, would make three here."""
    made = []

    class Counted(torch.utils.data.DataLoader):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("num_workers"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", Counted)
    windows = Windows(torch.arange(2000).to(torch.uint16), sequence_length=16, limit=40)
    cursor = DataCursor(windows, batch_size=8, seed=1, world=World(), workers=2)
    for _ in range(3 * 5 + 1):  # three epochs of 5 batches, and the first of the fourth
        cursor.next()
    assert made == [2] and cursor.state()["epoch"] == 3 and cursor.state()["batch"] == 1


def test_run_batches_dataset_refuses_positions_past_its_end():
    batches = RunBatches(Windows(torch.arange(100), 9), batch_size=2, seed=0, epoch=0, start_batch=4)
    assert len(batches) == RunBatches.EPOCHS * 5 and batches[1][:2] == (1, 0)  # batch 4 of 5, then the next epoch
    for outside in (-1, len(batches)):
        with pytest.raises(IndexError):
            batches[outside]


def test_sequential_batches_cover_every_validation_example_once():
    windows = Windows(torch.arange(100), sequence_length=9)
    seen = torch.cat([x for x, _ in sequential_batches(windows, batch_size=4)])
    assert seen.shape[0] == len(windows) == 11
    assert torch.equal(seen[:, 0], torch.arange(0, 99, 9))
