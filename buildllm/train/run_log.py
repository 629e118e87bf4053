"""What a training run reports: its log as DVC plot files, metrics/train.json, and a loss PNG.

The log is written twice, metrics/train_log.csv for people and metrics/train_log.json for `dvc plots
diff`: DVC reads a CSV's cells as strings, a JSON file's numbers as numbers.

elapsed_seconds is training time, validation and saves included, start-up not; on resume it continues
from the checkpoint's value, so two devices' runs line up on one time axis however often they stopped.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
from pathlib import Path

from buildllm.atomic import atomic_write, atomic_write_text
from buildllm.data.text_bytes import bits_per_byte
from buildllm.device.load import LoadSampler
from buildllm.metrics import summary_path, write_metrics
from buildllm.paths import TRAIN_LOG_CSV, TRAIN_LOG_JSON, metrics_path
from buildllm.train import distributed
from buildllm.train.against_estimate import against_estimate
from buildllm.train.against_estimate import describe as describe_estimate
from buildllm.train.distributed import World

COLUMNS = (
    "step",
    "tokens_seen",
    "train_loss",
    "validation_loss",
    "validation_bits_per_byte",
    "learning_rate",
    "tokens_per_second",
    "elapsed_seconds",
)
PNG_PATH = Path("plots/train_loss.png")
# The folders a run writes besides its checkpoints, checked before it trains (train/loop.py).
FOLDERS = (TRAIN_LOG_CSV.parent, summary_path(metrics_path("train")).parent, PNG_PATH.parent)


class RunLog:
    """The train loop's record of one run. `facts` (the plan, sizes) are train.json's first keys; rows
    cover the whole run, steps and seconds this session only, so a resumed run reports its own speed."""

    def __init__(self, world: World, tokens_per_step: int, facts: dict, cores_used: int = 1):
        self.world, self.facts = world, facts
        self.tokens_per_step = tokens_per_step  # this process's share of one optimizer step
        self.cores_used = cores_used  # for the load from other processes (device/load.py)
        self.rows: list[dict] = []
        self.saves: list[tuple[float, int]] = []  # (seconds, bytes) of each checkpoint save
        self.elapsed_before = 0.0  # training time of earlier sessions, as the resumed checkpoint saved it
        self._new_session()

    def _new_session(self) -> None:
        self.started, self.steps, self.seconds = time.perf_counter(), 0, 0.0
        self._losses: list[float] = []  # of the steps since the last row
        self._seconds: list[float] = []

    def begin(self) -> None:
        self._new_session()
        self.load = LoadSampler(self.cores_used)  # sampled at each row: whether others took our cores
        if self.world.is_main:
            self.write_log()

    def restore(self, rows: list[dict], step: int, elapsed: float) -> None:
        """The rows a checkpoint of step `step` carried (later ones belong to steps a resume redoes),
        and the training time it had taken to get there."""
        self.rows = [row for row in rows if row["step"] <= step]
        self.elapsed_before = elapsed

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started

    def add_step(self, loss: float, seconds: float) -> None:
        self.steps, self.seconds = self.steps + 1, self.seconds + seconds
        self._losses.append(loss)
        self._seconds.append(seconds)

    def record(self, step: int, tokens_seen: int, learning_rate: float, validation: float | None) -> dict:
        seconds = sum(self._seconds)
        # Each process measures its own rate; the run's rate is their sum.
        local = len(self._losses) * self.tokens_per_step / seconds if seconds else 0.0
        rate = distributed.all_sum(self.world, [local])[0]
        self.load.sample()
        row = {
            "step": step,
            "tokens_seen": tokens_seen,
            "train_loss": sum(self._losses) / len(self._losses) if self._losses else None,
            "validation_loss": validation,
            "validation_bits_per_byte": self.bits_per_byte(validation),
            "learning_rate": learning_rate,
            "tokens_per_second": rate if seconds else None,
            "elapsed_seconds": self.elapsed(),
        }
        self.rows.append(row)
        self._losses, self._seconds = [], []
        if self.world.is_main:
            self.write_log()
        return row

    def bits_per_byte(self, loss: float | None) -> float | None:
        return bits_per_byte(loss, self.facts.get("validation_bytes_per_token"))

    def write_log(self) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: _cell(row.get(key)) for key in COLUMNS} for row in self.rows)
        atomic_write_text(TRAIN_LOG_CSV, buffer.getvalue())
        # JSON: a list of objects with every key in each, as DVC needs.
        records = [{key: _number(row.get(key)) for key in COLUMNS} for row in self.rows]
        atomic_write_text(TRAIN_LOG_JSON, json.dumps(records, indent=1) + "\n")

    def metrics(self, status: str, progress: dict, extra: dict) -> dict:
        """metrics/train.json: flat; what is unknown (no save yet, no step this session) is left out."""
        train_loss = next((r["train_loss"] for r in reversed(self.rows) if r["train_loss"] is not None), None)
        last = next((r for r in reversed(self.rows) if r["validation_loss"] is not None), None)
        # "Final" only when validated at the step the run ended on; after a stop, the last evaluation
        # is reported with its step, never passed off as the final one.
        validation = last["validation_loss"] if last and last["step"] == progress["optimizer_steps"] else None
        missing = f"no validation since step {last['step']}" if last else "no validation ran"
        note = None if validation is not None else missing
        initial = self.rows[0]["validation_loss"] if self.rows and self.rows[0]["step"] == 0 else None
        seconds = [s for s, _ in self.saves]
        session_tokens = self.steps * self.tokens_per_step * self.world.size
        metrics = {
            **self.facts,
            "status": status,
            **progress,
            "final_train_loss": train_loss,
            "train_perplexity": _exp(train_loss),
            "final_validation_loss": validation,
            "validation_perplexity": _exp(validation),
            "final_validation_bits_per_byte": self.bits_per_byte(validation),
            "last_validation_loss": last["validation_loss"] if last else None,
            "last_validation_bits_per_byte": self.bits_per_byte(last["validation_loss"] if last else None),
            "last_validation_step": last["step"] if last else None,
            "final_validation_note": note,
            "initial_validation_loss": initial,
            "initial_validation_bits_per_byte": self.bits_per_byte(initial),
            "unigram_validation_bits_per_byte": self.bits_per_byte(self.facts.get("unigram_validation_loss")),
            "elapsed_seconds": time.perf_counter() - self.started,
            "session_steps": self.steps,
            "session_train_seconds": self.seconds,
            "tokens_per_second": session_tokens / self.seconds if self.seconds else None,
            "steps_per_second": self.steps / self.seconds if self.seconds else None,
            "checkpoints_saved": len(seconds),
            "checkpoint_save_seconds_mean": sum(seconds) / len(seconds) if seconds else None,
            "checkpoint_save_seconds_max": max(seconds) if seconds else None,
            "checkpoint_bytes": self.saves[-1][1] if self.saves else None,
            "oom": False,
            **self.load.figures(),
            **extra,
        }
        return {
            k: v for k, v in metrics.items() if v is not None and not (isinstance(v, float) and not math.isfinite(v))
        }

    def finish(self, status: str, progress: dict, extra: dict) -> dict:
        metrics = self.metrics(status, progress, extra)
        if self.world.is_main:
            self.write_log()
            title = f"{metrics['profile']} on {metrics['device']} ({metrics['precision']})"
            try:
                write_png(self.rows, f"{title}, {metrics['optimizer_steps']} steps")
            except (ImportError, OSError, MemoryError) as error:
                # The metrics are the record; a plot that cannot be drawn (no memory left to load its
                # libraries after an out-of-memory) must not lose them.
                print(f"warning: no loss plot ({error}); the metrics and the log are still written", file=sys.stderr)
            # Last, so the run's time includes everything the estimate projects, the plot too.
            measured = against_estimate(metrics)
            metrics.update(measured)
            path = write_metrics(metrics_path("train"), metrics)
            if status == "completed":
                speed = f"at {metrics['tokens_per_second']:,.0f} tokens/s" if self.steps else "(nothing left to train)"
                bits = metrics.get("final_validation_bits_per_byte")
                in_bits = "" if bits is None else f" nats/token, {bits:.4f} bits/byte"
                print(
                    f"trained {metrics['optimizer_steps']} steps ({metrics['tokens_processed']:,} tokens) {speed}; "
                    f"validation loss {metrics['final_validation_loss']:.4f}{in_bits} "
                    f"(perplexity {metrics['validation_perplexity']:.1f}; {baselines(metrics)}); "
                    f"checkpoint in {metrics['checkpoint_directory']}; metrics in {path}"
                )
            # Last: the estimate's verdict beside whether other processes took this run's cores.
            load = metrics.get("busy_machine_reason")
            if measured:
                print(f"estimate: this run {describe_estimate(measured)}" + (f"; {load}" if load else ""))
            elif load:
                print(load)
        return metrics


def write_png(rows: list[dict], title: str, path: str | Path = PNG_PATH) -> Path:
    """Train and validation loss against the optimizer step, for a person offline (DVC draws the same)."""
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


def baselines(metrics: dict) -> str:
    """What the loss is to be compared with: the context-free unigram level (train always measures it)
    and a uniform guess."""
    unigram, bits = metrics["unigram_validation_loss"], metrics.get("unigram_validation_bits_per_byte")
    in_bits = f" ({bits:.4f} bits/byte)" if bits is not None else ""
    return f"unigram level {unigram:.4f}{in_bits}, a uniform guess {math.log(metrics['vocab_size']):.4f}"


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _number(value):
    """The number as written to the CSV (6 significant digits), null when there is none."""
    cell = _cell(value)
    return None if cell == "" else int(cell) if isinstance(value, int) else float(cell)


def _exp(loss: float | None) -> float | None:
    return math.exp(min(loss, 700.0)) if loss is not None and math.isfinite(loss) else None
