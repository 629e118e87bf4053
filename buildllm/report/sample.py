"""A short text from the trained checkpoint, for the run card: what the loss figures read like.

Fixed settings, so two runs' samples differ only by their weights: the prompt "The", 60 new
tokens sampled at temperature 0.8 among the 50 likeliest, the run's seed, on the CPU (a few
dozen single-token steps with the KV cache: cheap on any machine, and the same draws on every
device, buildllm/train/generate.py). Written to metrics/sample_notes.json with the checkpoint's step.
"""

from __future__ import annotations

import json
from pathlib import Path

from buildllm.atomic import atomic_write_text
from buildllm.config import Config
from buildllm.errors import UserError

SAMPLE_PATH = Path("metrics/sample_notes.json")
SETTINGS = {"prompt": "The", "new_tokens": 60, "temperature": 0.8, "top_k": 50}


def write_sample(config: Config) -> None:
    """The sample and how it was drawn, or why there is none (no checkpoint yet), into SAMPLE_PATH."""
    from buildllm.train.generate import checkpoint_tokenizer, generate_ids, load_checkpoint, model_from

    sample = {**SETTINGS, "seed": config.seed, "device": "cpu"}
    try:
        path, state = load_checkpoint(config.train.checkpoint_directory)
        model = model_from(state, "cpu")
        encoder = checkpoint_tokenizer(
            state.get("tokenizer", ""), config.train.tokenizer, path, model.config.vocab_size
        )
    except UserError as exc:
        sample["missing_reason"] = str(exc)
    else:
        prompt = encoder.encode(SETTINGS["prompt"]).ids
        draw = {k: SETTINGS[k] for k in ("temperature", "top_k")}
        ids = generate_ids(model, prompt, SETTINGS["new_tokens"], seed=config.seed, **draw)
        sample.update(text=encoder.decode(ids), checkpoint_step=state["step"], checkpoint=path.name)
    atomic_write_text(SAMPLE_PATH, json.dumps(sample, indent=2, ensure_ascii=False) + "\n")
