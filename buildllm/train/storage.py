"""The disk a run needs, checked before it starts, so a run refused here has written nothing; a run
that starts has room for every save it plans, unless something else fills the disk meanwhile (then
the save itself says so: buildllm.disk).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from buildllm import disk
from buildllm.config import TrainConfig
from buildllm.device import health
from buildllm.errors import UserError
from buildllm.train import checkpoint
from buildllm.units import size

# metrics/train.json, the loss PNG and a CSV row per log interval; a checkpoint also carries the log.
LOG_BYTES = 512 * 1024
ROW_BYTES = 200


@dataclass(frozen=True)
class Storage:
    directory: Path
    checkpoint_bytes: int
    kept: int  # at the peak, the checkpoints kept beside the one being written
    new_files: int  # at the peak, checkpoint files beyond those in the directory now
    log_bytes: int
    free: int

    @property
    def needed(self) -> int:
        return self.new_files * self.checkpoint_bytes + self.log_bytes

    @property
    def fits(self) -> bool:
        return self.free >= self.needed

    def figure(self) -> str:
        return f"{size(self.free)} free, needs {size(self.needed)}"

    def explain(self) -> str:
        return (
            f"{self.kept} kept + 1 being written, {self.new_files} new × {size(self.checkpoint_bytes)}, "
            f"+ {size(self.log_bytes)} of logs"
        )


def storage(train: TrainConfig, checkpoint_bytes: int, planned_steps: int, start_step: int, existing: int) -> Storage:
    """The disk a run of `train`'s settings takes from `start_step` on, with `existing` checkpoints
    already in its directory (a resume): a save writes the new file before the oldest is pruned."""
    # Saves from start_step on, as the train loop makes them: every checkpoint_interval steps before the
    # last, and one at the end (also when a resume finds nothing left to train).
    saves, interval = 1, train.checkpoint_interval
    if interval > 0 and start_step < planned_steps:
        saves = (planned_steps - 1) // interval - start_step // interval + 1
    at_most = min(existing + saves, train.keep_checkpoints + 1)
    rows = planned_steps // max(1, train.log_interval) + 2
    return Storage(
        Path(train.checkpoint_directory),
        int(checkpoint_bytes),
        at_most - 1,
        max(0, at_most - existing),
        LOG_BYTES + rows * ROW_BYTES,
        disk.free_bytes(train.checkpoint_directory),
    )


def checkpoint_bytes(parameters: int, buffer_bytes: int = 0) -> int:
    """A checkpoint of a model trained with AdamW: fp32 weights plus two fp32 moments per weight, its
    buffers; the schedule, RNG state, cursor and log add tens of kilobytes."""
    return 3 * parameters * 4 + buffer_bytes + 64 * 1024


def before_training(trainer, resumed: dict | None) -> None:
    """Preflight's checks at the start of `train`: room for the checkpoints from here on (a resume
    counts those already there), else a refusal; a warning when the machine runs on battery."""
    existing = checkpoint.list_checkpoints(trainer.directory) if resumed is not None else []
    # Without a checkpoint to measure: the built model's, its state_dict beyond the weights counted as buffers.
    parameters = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    buffers = checkpoint.state_bytes(trainer.model.state_dict()) - 4 * parameters
    size_each = existing[-1].stat().st_size if existing else checkpoint_bytes(parameters, buffers)
    needed = storage(
        trainer.config.train, size_each, trainer.planned_steps, resumed["step"] if resumed else 0, len(existing)
    )
    if not needed.fits:
        raise UserError(
            f"not enough disk space for this run: {needed.directory} has {size(needed.free)} ({needed.free:,} bytes) "
            f"free but the run needs about {size(needed.needed)} ({needed.needed:,} bytes): {needed.explain()}; free "
            "some space, lower --keep-checkpoints, or use a --checkpoint-directory on a disk with room"
        )
    if warning := health.power_warning():
        print(f"warning: {warning}", file=sys.stderr)
