"""Text from a trained checkpoint: greedy or sampled (temperature, top-k), with or without a KV cache.

With the cache the prompt runs once (prefill) and each new token runs alone. Both ways condition on
the last sequence_length tokens: once the text outgrows them, the cache is rebuilt from that window
each step, as the model never saw positions beyond it in training.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from buildllm.config import Config
from buildllm.data.tokenization import load_tokenizer
from buildllm.errors import UserError
from buildllm.metrics import json_line
from buildllm.model.gpt import GPT, KVCache, build_model
from buildllm.plan.device import resolve_device
from buildllm.train import checkpoint


def load_checkpoint(location: str | Path) -> tuple[Path, dict]:
    """A checkpoint file and its state, or the newest intact checkpoint in a training run's directory
    (a damaged one is named and passed over, as a resume does)."""
    location = Path(location)
    if location.is_file():
        return location, checkpoint.load(location)
    found = checkpoint.list_checkpoints(location)
    if not found:
        raise UserError(
            f"no checkpoint in {location}; train first (`buildllm train`) or pass "
            "--checkpoint-directory of a finished or interrupted run"
        )
    if latest := checkpoint.load_latest(location):
        return latest
    raise UserError(
        f"none of the {len(found)} checkpoint(s) in {location} is intact (each is named above); train again, "
        "or pass --checkpoint-directory of another run"
    )


def model_from(state: dict, device: str) -> GPT:
    model = build_model(checkpoint.saved_model(state), device)
    model.load_state_dict(state["model"])
    return model.eval()


def load_model(path: Path, device: str) -> tuple[GPT, dict]:
    state = checkpoint.load(path)
    return model_from(state, device), state


def checkpoint_tokenizer(saved: str, override: str | None, path: Path, vocab_size: int):
    """The tokenizer the checkpoint was trained with (or --tokenizer), checked against the model's vocabulary."""
    candidates = [Path(override)] if override else [Path(saved), path.parent / Path(saved).name]
    for candidate in candidates:
        if candidate.is_file():
            return load_tokenizer(candidate, vocab_size)
    raise UserError(
        f"the tokenizer of {path} ({override or saved or 'none recorded'}) is not there; run from the "
        "project root where it was trained, or pass --tokenizer with the tokenizer's JSON file"
    )


def next_token(
    logits: torch.Tensor, greedy: bool, temperature: float, top_k: int | None, generator: torch.Generator
) -> int:
    if not bool(torch.isfinite(logits).all()):
        # Finite weights can still overflow (a checkpoint saved before digests, its bytes damaged).
        raise UserError(
            "the model's output holds NaN or infinity, so no token can be drawn; its checkpoint's weights are "
            "broken: use another checkpoint"
        )
    if greedy or temperature == 0:
        return int(logits.argmax())
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # Sampling on the CPU with a CPU generator: the same seed gives the same text on every device.
    probabilities = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probabilities, 1, generator=generator))


@torch.no_grad()
def generate_ids(
    model: GPT,
    prompt: list[int],
    max_new_tokens: int,
    *,
    greedy: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    kv_cache: bool = True,
    seed: int = 0,
) -> list[int]:
    if not prompt:
        raise UserError("the prompt has no tokens; give a non-empty --prompt")
    window = model.config.sequence_length
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)

    def run(tokens: list[int], cache: KVCache | None) -> torch.Tensor:
        logits, _ = model(torch.tensor([tokens], device=device), cache=cache)
        return logits[0, -1]

    cache = None
    for _ in range(max_new_tokens):
        if cache is not None and cache.length < window:
            logits = run(ids[-1:], cache)
        else:
            cache = KVCache(model.config.n_layer) if kv_cache else None
            logits = run(ids[-window:], cache)
        ids.append(next_token(logits, greedy, temperature, top_k, generator))
    return ids


def announce(model: GPT, state: dict, path: Path, device: str, reason: str, max_new_tokens: int) -> None:
    """The same startup line as train's: generation runs the checkpoint's fp32 weights, one sequence,
    no optimizer, so the training-only fast paths are off and say why."""
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32)  # torch's default, off: generation never turns it on
    json_line(
        action="generate",
        device=device,
        device_reason=reason,
        precision="fp32",
        tensor_cores_enabled=tf32,
        tf32_enabled=tf32,
        fused_adamw=False,
        fused_adamw_reason="generation builds no optimizer",
        grad_scaler=False,
        profile=(state.get("signature") or {}).get("profile"),
        parameters=model.num_parameters(),
        batch_size=1,
        workers=0,
        sequence_length=model.config.sequence_length,
        planned_steps=max_new_tokens,
        checkpoint=str(path),
        checkpoint_step=state["step"],
        decisions={
            "device": f"{device}: {reason}",
            "precision": "fp32: the checkpoint's weights, no autocast for generation",
        },
    )


def command(args: argparse.Namespace, config: Config) -> None:
    if args.max_new_tokens < 0 or args.temperature < 0 or args.top_k < 0:
        raise UserError("--max-new-tokens, --temperature and --top-k must not be negative")
    decision = resolve_device(config.device)
    path, state = load_checkpoint(config.train.checkpoint_directory)
    model = model_from(state, decision.device)
    announce(model, state, path, decision.device, decision.reason, args.max_new_tokens)
    encoder = checkpoint_tokenizer(state.get("tokenizer", ""), args.tokenizer, path, model.config.vocab_size)
    prompt_ids = encoder.encode(args.prompt).ids
    if prompt_ids and max(prompt_ids) >= model.config.vocab_size:
        raise UserError(
            f"the tokenizer gives id {max(prompt_ids)} but the model has {model.config.vocab_size}; "
            "use the tokenizer the checkpoint was trained with"
        )
    top_k = args.top_k or None
    how = "greedy" if args.greedy else f"temperature {args.temperature}, top-k {top_k}"
    cache = "with" if args.kv_cache else "without"
    print(f"{path} (step {state['step']}) on {decision.device}: {how}, {cache} KV cache", file=sys.stderr)
    ids = generate_ids(
        model,
        prompt_ids,
        args.max_new_tokens,
        greedy=args.greedy,
        temperature=args.temperature,
        top_k=top_k,
        kv_cache=args.kv_cache,
        seed=config.seed,
    )
    print(encoder.decode(ids))
