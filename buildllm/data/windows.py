"""Training examples from a token tensor, in a deterministic order that a resumed run can continue.

An example is a window of sequence_length + 1 consecutive tokens: the first sequence_length are the
input, the last sequence_length (shifted by one) the targets. Windows start every sequence_length
tokens, so each token is a target once per epoch; no window reaches past the tensor's end.
The order within an epoch is a permutation seeded by (seed, epoch): the same on every machine and
after a resume, so a cursor (epoch, position) is all a checkpoint needs to continue.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.data

from buildllm.config import Config
from buildllm.errors import UserError
from buildllm.paths import token_paths
from buildllm.shape import GPTConfig

INTEGER_DTYPES = (torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64)


def max_token(tokens: torch.Tensor, chunk: int = 1 << 24) -> int:
    """Largest id, in chunks: torch has no max() for uint16 and a widened copy of a large file is costly."""
    return max(int(tokens[i : i + chunk].to(torch.int64).max()) for i in range(0, tokens.numel(), chunk))


def load_tokens(path: str | Path, vocab_size: int | None = None, what: str = "token file") -> torch.Tensor:
    path = Path(path)
    if not path.exists():
        raise UserError(
            f"{what} {path} does not exist; run `dvc repro tokenize` (or `buildllm tokenize`) first, "
            "or pass an existing file"
        )
    try:
        tokens = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a file that is not a tensor
        raise UserError(
            f"{what} {path} is not a saved torch tensor ({type(exc).__name__}); re-create it with `buildllm tokenize`"
        ) from None
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.dtype not in INTEGER_DTYPES:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        dtype = tokens.dtype if isinstance(tokens, torch.Tensor) else "-"
        raise UserError(
            f"{what} {path} must be a 1-D integer tensor, got shape {shape} dtype {dtype}; "
            "re-create it with `buildllm tokenize`"
        )
    if tokens.numel() == 0:
        raise UserError(f"{what} {path} is empty; tokenize a corpus that has text")
    if vocab_size is not None and (largest := max_token(tokens)) >= vocab_size:
        raise UserError(
            f"{what} {path} holds token id {largest} but the model's vocabulary has {vocab_size} "
            "ids; use the tokenizer and tokens made for this profile's vocab_size"
        )
    return tokens


@dataclass(frozen=True)
class Windows:
    tokens: torch.Tensor
    sequence_length: int
    limit: int | None = None

    def __post_init__(self):
        if self.available < 1:
            raise UserError(
                f"{self.tokens.numel()} tokens are fewer than one example of "
                f"{self.sequence_length + 1} tokens; use a larger corpus or a shorter sequence_length"
            )

    @property
    def available(self) -> int:
        return (self.tokens.numel() - 1) // self.sequence_length

    def __len__(self) -> int:
        return self.available if self.limit is None else min(self.limit, self.available)

    def cap_note(self, knob: str) -> str:
        """A sentence when `knob` (the limit's config key) changes how many examples are used; "" otherwise."""
        if self.limit is not None and self.limit < self.available:
            return f"{knob} = {self.limit:,} uses {self.limit:,} of the {self.available:,} windows the token file holds"
        if self.limit is not None and self.limit > self.available:
            return (
                f"{knob} = {self.limit:,} asks for more windows than the token file's {self.available:,}; "
                f"all {self.available:,} are used"
            )
        return ""

    def example(self, index: int) -> torch.Tensor:
        start = index * self.sequence_length
        return self.tokens[start : start + self.sequence_length + 1]

    def pair(self, indices: list[int] | torch.Tensor) -> torch.Tensor:
        """The examples' inputs and targets as one contiguous (2, batch, sequence_length) int64 tensor:
        one buffer to pin and one copy to a device, after which both halves are contiguous there."""
        rows = torch.stack([self.example(int(i)) for i in indices])
        pair = torch.empty((2, rows.shape[0], self.sequence_length), dtype=torch.int64)
        pair[0].copy_(rows[:, :-1])
        pair[1].copy_(rows[:, 1:])
        return pair

    def batch(self, indices: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.pair(indices)
        return inputs, targets


def split_windows(config: Config, model: GPTConfig, split: str) -> Windows:
    train_path, validation_path = token_paths(config, model.vocab_size)
    path, limit, what = {
        "train": (train_path, config.train.training_examples, "training token file"),
        "validation": (validation_path, config.train.validation_examples, "validation token file"),
    }[split]
    tokens = load_tokens(path, model.vocab_size, what)
    if (tokens.numel() - 1) // model.sequence_length < 1:
        raise UserError(too_short(what, path, tokens.numel(), model.sequence_length))
    return Windows(tokens, model.sequence_length, limit)


def too_short(what: str, path: Path, count: int, sequence_length: int) -> str:
    """Which file cannot give one example, and the two ways out: a shorter sequence, or more text there."""
    more = (
        "raise corpus.validation_percent and rerun corpus and tokenize, or pass a larger --validation-tokens file"
        if what.startswith("validation")
        else "use a larger corpus, or pass a larger --train-tokens file"
    )
    shorter = f"lower --sequence-length (model.sequence_length) to at most {count - 1:,}, or " if count > 2 else ""
    return (
        f"the {what} {path} holds {count:,} tokens, fewer than one example of {sequence_length + 1:,} tokens "
        f"(sequence_length {sequence_length:,} and the token after it); {shorter}{more}"
    )


def check_examples(config: Config, model: GPTConfig) -> None:
    """What a dry run can promise of the data: each token file that exists gives at least one example
    at this sequence length, in this vocabulary (a missing one is the tokenize stage's still to make)."""
    for split, path in zip(("train", "validation"), token_paths(config, model.vocab_size)):
        if path.exists():
            split_windows(config, model, split)


def load_windows(config: Config, model: GPTConfig) -> tuple[Windows, Windows]:
    return split_windows(config, model, "train"), split_windows(config, model, "validation")


def windows_or_random(config: Config, model: GPTConfig, batch_size: int) -> tuple[Windows, Windows, str]:
    """The token files' windows when they exist, else seeded random tokens, for a measurement that
    needs steps, not learning (a step costs the same on any tokens; a loss on random ones says
    nothing): (train, validation, "real" or "random")."""
    try:
        return (*load_windows(config, model), "real")
    except UserError:
        length = model.sequence_length
        generator = torch.Generator().manual_seed(config.seed)
        tokens = torch.randint(model.vocab_size, (16 * batch_size * length + 1,), generator=generator)
        return Windows(tokens, length), Windows(tokens[: 4 * batch_size * length + 1], length), "random"


def epoch_order(n_examples: int, seed: int, epoch: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_examples, generator=generator)


def batches_per_epoch(n_examples: int, batch_size: int) -> int:
    # The last partial batch is dropped: every step sees the same number of tokens.
    return n_examples // batch_size


def planned_steps(batches_per_epoch: int, epochs: int, grad_accum: int) -> int:
    """Optimizer steps of a run: the data cursor carries leftover micro-batches into the next epoch."""
    return batches_per_epoch * epochs // grad_accum


def optimizer_steps(examples: int, batch_size: int, grad_accum: int, epochs: int) -> int:
    """The Trainer's count of a run's optimizer steps (batch_size: all processes' together); a plan
    that makes none is refused with what to change."""
    steps = planned_steps(batches_per_epoch(examples, batch_size), epochs, grad_accum)
    if steps < 1:
        raise UserError(
            f"{examples} examples in batches of {batch_size} x {grad_accum} accumulation steps over "
            f"{epochs} epoch(s) make no optimizer step; raise --training-examples or --epochs, "
            "or lower --batch-size or --grad-accum"
        )
    return steps


class RunBatches(torch.utils.data.Dataset):
    """Every epoch's batches from (epoch, start_batch) on as one dataset: item i is the i-th batch after
    that point, as (epoch, batch_index, pair), pair the batch's Windows.pair. Each item is a whole batch, so DataLoader
    workers build batches in parallel in the order epoch_order fixes (rank r takes its slice of each
    global batch). One DataLoader serves the whole run, so its workers start once: a loader per epoch
    would start them again inside a measured interval when epochs are short (a few batches at a large
    batch size on a GPU)."""

    EPOCHS = 1_000_000  # "without end": the trainer stops taking batches long before

    def __init__(
        self,
        windows: Windows,
        batch_size: int,
        seed: int,
        epoch: int,
        start_batch: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.windows, self.batch_size, self.seed, self.rank = windows, batch_size, seed, rank
        self.global_batch = batch_size * world_size
        self.per_epoch = batches_per_epoch(len(windows), self.global_batch)
        self.first = epoch * self.per_epoch + start_batch
        self.count = self.EPOCHS * self.per_epoch
        self._order: tuple[int, torch.Tensor] | None = None  # the epoch whose order each process holds

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, position: int) -> tuple[int, int, torch.Tensor]:
        if not 0 <= position < self.count:
            raise IndexError(position)
        epoch, index = divmod(self.first + position, self.per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(len(self.windows), self.seed, epoch))
        chunk = self._order[1][index * self.global_batch : (index + 1) * self.global_batch]
        return epoch, index, self.windows.pair(chunk[self.rank * self.batch_size : (self.rank + 1) * self.batch_size])


def loader(batches: RunBatches, workers: int = 0, pin_memory: bool = False, context: str | None = None):
    """The batches' items, built by `workers` background processes when workers > 0 (with pin_memory in
    page-locked memory, ready for Device.put_pair's non-blocking copy). workers=0 builds each batch in
    the training process: slicing windows out of one tensor is cheap, and workers cost a start-up and a
    copy between processes for every batch. `context`: how workers start (None: the platform's
    default; Device.worker_context says which a device needs)."""
    if workers <= 0:
        yield from batches  # a dataset iterates through its items until IndexError
        return
    # batch_size=None: the dataset's items already are batches, passed through unchanged.
    yield from torch.utils.data.DataLoader(
        batches,
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        multiprocessing_context=context,
    )


def sequential_batches(windows: Windows, batch_size: int):
    """Validation batches in file order; the last one may be smaller so no example is skipped."""
    for start in range(0, len(windows), batch_size):
        yield windows.batch(range(start, min(start + batch_size, len(windows))))
