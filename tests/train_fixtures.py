"""Small real training data for the training tests: a byte-level BPE with the tiny preset's 4096 ids,
trained on this project's own text (README and source), and its train and validation token tensors.
Real text, so the loss falls; small, so a tiny model trains on it in seconds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[1]


def project_text() -> str:
    files = [ROOT / "README.md", *sorted((ROOT / "buildllm").rglob("*.py"))]
    return "\n\n".join(path.read_text() for path in files)


def make_token_files(folder: Path, vocab_size: int = 4096) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    text = project_text()
    tokenizer.train_from_iterator([text], trainer=trainer)
    ids = torch.tensor(tokenizer.encode(text).ids, dtype=torch.int32)
    cut = int(ids.numel() * 0.9)
    paths = {
        "tokenizer": folder / "tokenizer.json",
        "train": folder / "train.pt",
        "validation": folder / "validation.pt",
    }
    tokenizer.save(str(paths["tokenizer"]))
    torch.save(ids[:cut].clone(), paths["train"])
    torch.save(ids[cut:].clone(), paths["validation"])
    return paths


def train_args(paths: dict[str, Path], directory: Path, *extra: str, examples: int = 320) -> list[str]:
    """A bounded run of preset tiny on the CPU: 320 examples in batches of 16 = 20 optimizer steps."""
    return [
        "train",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--train-tokens",
        str(paths["train"]),
        "--validation-tokens",
        str(paths["validation"]),
        "--tokenizer",
        str(paths["tokenizer"]),
        "--training-examples",
        str(examples),
        "--validation-examples",
        "32",
        "--batch-size",
        "16",
        "--log-interval",
        "2",
        "--eval-interval",
        "10",
        "--checkpoint-interval",
        "2",
        "--checkpoint-directory",
        str(directory),
        *extra,
    ]


def same_tensors(a: dict, b: dict) -> list[str]:
    """Names of tensors that are not bitwise equal (values and dtypes), recursing into nested state."""
    differing = []

    def walk(x, y, name):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)):
                differing.append(name)
        elif isinstance(x, dict):
            if not isinstance(y, dict) or set(x) != set(y):
                differing.append(name)
            else:
                for key in x:
                    walk(x[key], y[key], f"{name}.{key}")
        elif isinstance(x, (list, tuple)):
            if not isinstance(y, (list, tuple)) or len(x) != len(y):
                differing.append(name)
            else:
                for i, (u, v) in enumerate(zip(x, y)):
                    walk(u, v, f"{name}[{i}]")
        elif x != y:
            differing.append(name)

    walk(a, b, "state")
    return differing


def read(path: Path) -> dict:
    """A JSON file's content (a metrics record)."""
    return json.loads(Path(path).read_text())


def damage(path, rng: random.Random, region: str = "anywhere") -> tuple[int, int]:
    """Overwrite 1 to 64 bytes at a random offset (anywhere, or in the first or last 512 bytes) with
    random bytes, each one different from before (a write of the same value is no damage). Returns
    (offset, length)."""
    data = bytearray(path.read_bytes())
    low, high = {"anywhere": (0, len(data)), "start": (0, 512), "end": (len(data) - 512, len(data))}[region]
    offset = rng.randrange(low, high)
    length = min(rng.randint(1, 64), len(data) - offset)
    for i in range(offset, offset + length):
        data[i] ^= rng.randint(1, 255)
    path.write_bytes(bytes(data))
    return offset, length
