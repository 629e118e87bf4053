"""Generation from a checkpoint: the KV cache changes speed, not text; sampling follows its seed."""

from __future__ import annotations

import json

import pytest
import torch

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.data.windows import Windows, load_tokens
from buildllm.model.gpt import GPTConfig, KVCache, build_model
from buildllm.plan.run_plan import apply_plan, make_plan
from buildllm.train import checkpoint
from buildllm.train.generate import generate_ids, load_model
from buildllm.train.trainer import Trainer


@pytest.fixture(scope="module")
def trained(tokens, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("generate")
    plan = make_plan(
        load_config(
            None,
            {
                "preset": "tiny",
                "device": "cpu",
                "train.threads": 1,
                "train.batch_size": 16,
                "train.training_examples": 480,
            },
        )
    )
    apply_plan(plan)
    trainer = Trainer(
        plan, Windows(load_tokens(tokens["train"]), 64, 480), tokenizer=tokens["tokenizer"], directory=folder / "run"
    )
    for _ in range(trainer.planned_steps):
        trainer.step()
    trainer.save_checkpoint()
    return {**tokens, "directory": folder / "run"}


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_cached_logits_equal_a_full_recompute(architecture):
    torch.manual_seed(0)
    model = build_model(
        GPTConfig(architecture=architecture, vocab_size=97, sequence_length=16, n_layer=2, n_head=2, n_embd=32)
    ).eval()
    tokens = torch.randint(0, 97, (1, 16))
    cache = KVCache(2)
    with torch.no_grad():
        cached = [model(tokens[:, :5], cache=cache)[0][0, -1]]
        cached += [model(tokens[:, t : t + 1], cache=cache)[0][0, -1] for t in range(5, 16)]
        full = [model(tokens[:, :t])[0][0, -1] for t in range(5, 17)]
    for a, b in zip(cached, full):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_greedy_text_is_the_same_with_and_without_the_cache_past_the_window(trained):
    model, _ = load_model(checkpoint.list_checkpoints(trained["directory"])[-1], "cpu")
    prompt = [5, 17, 42, 7, 99]
    # 5 + 90 tokens outgrow the 64-token window: the cached path must slide it like the uncached one.
    with_cache = generate_ids(model, prompt, 90, greedy=True, kv_cache=True)
    without = generate_ids(model, prompt, 90, greedy=True, kv_cache=False)
    assert with_cache == without and len(with_cache) == 95 and with_cache[:5] == prompt
    assert generate_ids(model, prompt, 30, top_k=1, seed=3) == with_cache[:35]  # top-1 sampling is greedy


def test_sampling_follows_its_seed(trained):
    model, _ = load_model(checkpoint.list_checkpoints(trained["directory"])[-1], "cpu")
    first = generate_ids(model, [5, 17], 40, temperature=1.0, top_k=50, seed=1)
    assert generate_ids(model, [5, 17], 40, temperature=1.0, top_k=50, seed=1) == first
    assert generate_ids(model, [5, 17], 40, temperature=1.0, top_k=50, seed=2) != first
    assert generate_ids(model, [5, 17], 40, temperature=1.0, top_k=50, seed=1, kv_cache=False) == first


def test_the_command_prints_the_prompt_and_its_continuation(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "generate",
                "--checkpoint-directory",
                str(trained["directory"]),
                "--prompt",
                "The history of",
                "--max-new-tokens",
                "20",
                "--device",
                "cpu",
                "--seed",
                "7",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    startup, out = out.split("\n", 1)  # the startup JSON line first (tests/test_startup_line.py), then the text
    assert json.loads(startup)["action"] == "generate"
    assert out.startswith("The history of") and len(out.strip()) > len("The history of")
    assert "step 30" in err and "with KV cache" in err


def test_the_command_explains_a_missing_checkpoint_or_tokenizer(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "--checkpoint-directory", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "no checkpoint in" in capsys.readouterr().err
    assert (
        main(
            [
                "generate",
                "--checkpoint-directory",
                str(trained["directory"]),
                "--prompt",
                "x",
                "--tokenizer",
                str(tmp_path / "missing.json"),
            ]
        )
        == 2
    )
    assert "pass --tokenizer with the tokenizer's JSON file" in capsys.readouterr().err
