"""What a training run reports: its log as a DVC plot file, the same curves as a PNG a person can
open offline, and the flat metrics of metrics/train.json.

One CSV row per log interval (and per validation): `dvc plots diff` draws train and validation
loss against the step for several experiments at once. Validation runs less often than logging,
so its cell is empty on rows without one; the plot skips empty cells. The rows live in the
checkpoint too, so a resumed run rewrites the file without the rows of the steps it redoes.
"""

from __future__ import annotations

import csv
import io
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from buildllm.train import distributed
from buildllm.atomic import atomic_write, atomic_write_text
from buildllm.plan import plan_metrics

if TYPE_CHECKING:
    from buildllm.train.trainer import Trainer

COLUMNS = ("step", "tokens_seen", "train_loss", "validation_loss", "learning_rate", "tokens_per_second")
LOG_PATH = Path("metrics/train_log.csv")
PNG_PATH = Path("plots/train_loss.png")


class Session:
    """What this process has trained since it started (a resumed run counts from its resume)."""

    def __init__(self, started: float):
        self.started, self.steps, self.seconds = started, 0, 0.0
        self.interval_losses: list[float] = []
        self.interval_seconds: list[float] = []

    def add(self, loss: float, seconds: float) -> None:
        self.steps, self.seconds = self.steps + 1, self.seconds + seconds
        self.interval_losses.append(loss)
        self.interval_seconds.append(seconds)


def record(trainer: Trainer, session: Session, validation: float | None) -> dict:
    """Append a log row for the steps since the last one; rank 0 rewrites the plot file."""
    local_tokens = len(session.interval_losses) * trainer.plan.tokens_per_step
    seconds = sum(session.interval_seconds)
    # Each process measures its own rate; the run's rate is their sum.
    rate = distributed.all_sum(trainer.world, [local_tokens / seconds if seconds else 0.0])[0]
    losses = session.interval_losses
    row = {"step": trainer.step_count, "tokens_seen": trainer.tokens_seen,
           "train_loss": sum(losses) / len(losses) if losses else None, "validation_loss": validation,
           "learning_rate": trainer.learning_rate, "tokens_per_second": rate if seconds else None}
    trainer.log_rows.append(row)
    session.interval_losses, session.interval_seconds = [], []
    if trainer.world.is_main:
        write_log(trainer.log_rows)
    return row


def write_log(rows: list[dict], path: str | Path = LOG_PATH) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: _cell(row.get(key)) for key in COLUMNS})
    atomic_write_text(path, buffer.getvalue())
    return Path(path)


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_png(rows: list[dict], title: str, path: str | Path = PNG_PATH) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display needed: CI, servers, ssh sessions
    import matplotlib.pyplot as plt

    train = [(r["step"], r["train_loss"]) for r in rows if r.get("train_loss") is not None]
    validation = [(r["step"], r["validation_loss"]) for r in rows if r.get("validation_loss") is not None]
    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=100)
    if train:
        axis.plot(*zip(*train), label="train loss", color="tab:blue")
    if validation:
        axis.plot(*zip(*validation), label="validation loss", color="tab:orange", marker="o")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("cross-entropy loss (nats per token)")
    axis.set_title(title, fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png"))
    plt.close(figure)
    return Path(path)


def train_metrics(trainer: Trainer, session: Session, status: str, extra: dict) -> dict:
    """metrics/train.json: flat; what is unknown (no save yet, no step this session) is left out."""
    rows, cfg = trainer.log_rows, trainer.config.train
    trained = [r for r in rows if r["train_loss"] is not None]
    validated = [r for r in rows if r["validation_loss"] is not None]
    train_loss = trained[-1]["train_loss"] if trained else None
    validation = validated[-1]["validation_loss"] if validated else None
    seconds = [s for s, _ in trainer.saves]
    session_tokens = session.steps * trainer.tokens_per_step
    metrics = {
        **plan_metrics(trainer.plan, (trainer.fused_adamw, trainer.fused_adamw_reason)),
        "status": status, "processes": trainer.world.size,
        "global_batch_size": trainer.plan.batch_size * cfg.grad_accum * trainer.world.size,
        "tokens_per_step": trainer.tokens_per_step,
        "planned_steps": trainer.planned_steps, "optimizer_steps": trainer.step_count,
        "warmup_steps": trainer.schedule.warmup_steps, "epochs": cfg.epochs,
        "training_examples": len(trainer.train_windows), "validation_examples": len(trainer.validation_windows),
        "tokens_processed": trainer.tokens_seen, "final_train_loss": train_loss,
        "train_perplexity": _exp(train_loss), "final_validation_loss": validation,
        "validation_perplexity": _exp(validation),
        "initial_validation_loss": rows[0]["validation_loss"] if rows and rows[0]["step"] == 0 else None,
        "elapsed_seconds": time.perf_counter() - session.started, "train_seconds": trainer.train_seconds,
        "session_steps": session.steps, "session_train_seconds": session.seconds,
        "tokens_per_second": session_tokens / session.seconds if session.seconds else None,
        "steps_per_second": session.steps / session.seconds if session.seconds else None,
        "checkpoints_saved": len(seconds),
        "checkpoint_save_seconds_mean": sum(seconds) / len(seconds) if seconds else None,
        "checkpoint_save_seconds_max": max(seconds) if seconds else None,
        "checkpoint_bytes": trainer.saves[-1][1] if trainer.saves else None,
        "checkpoint_directory": str(trainer.directory), "tokenizer": trainer.tokenizer,
        "resumed": trainer.resumed_from is not None, "resumed_from_step": trainer.resumed_from or 0,
        "oom": False, **extra,
    }
    return {k: v for k, v in metrics.items() if v is not None and not (isinstance(v, float) and not math.isfinite(v))}


def _exp(loss: float | None) -> float | None:
    return math.exp(min(loss, 700.0)) if loss is not None and math.isfinite(loss) else None
