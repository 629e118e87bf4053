"""The training curves as a PNG a person can open offline (DVC draws the same from the log CSV)."""

from __future__ import annotations

from pathlib import Path

from buildllm.atomic import atomic_write

PNG_PATH = Path("plots/train_loss.png")


def write_png(rows: list[dict], title: str, path: str | Path = PNG_PATH) -> Path:
    """Train loss (every row that has one) and validation loss (marked) against the optimizer step."""
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
