import pytest
import torch

from buildllm.config import load_config, profile_for
from buildllm.model.gpt import GPTConfig, build_model
from buildllm.profiles import available_profiles, load_profile


@pytest.mark.parametrize(
    "name, expected, tolerance",
    [
        ("gpt_first_cpu", 1.3e6, 0.05),
        ("gpt_42m", 42e6, 0.02),
        ("gpt_100m", 98.5e6, 0.01),
        ("tiny", 0.636e6, 0.02),  # classic, with its own output layer
        ("student", 2.6e6, 0.02),  # modern
        ("small", 10e6, 0.07),
    ],
)
def test_profile_parameter_counts(name, expected, tolerance):
    count = build_model(load_profile(name).model, "meta").num_parameters()
    assert abs(count - expected) / expected <= tolerance, count


def test_every_profile_loads_with_cpu_and_gpu_defaults():
    assert set(available_profiles()) == {"gpt_first_cpu", "gpt_42m", "gpt_100m", "tiny", "student", "small"}
    for name in available_profiles():
        profile = load_profile(name)
        assert profile.cpu.batch_size > 0 and profile.gpu.batch_size >= profile.cpu.batch_size


def test_iteration_preset_and_overrides():
    assert profile_for(load_config(None, {"iteration": 2})).name == "gpt_42m"
    assert profile_for(load_config(None, {"iteration": 3, "preset": "tiny"})).name == "tiny"
    profile = profile_for(load_config(None, {"model.architecture": "modern", "model.n_layer": 2}))
    assert profile.model.architecture == "modern" and profile.model.n_layer == 2


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_model_trains_one_step_and_kv_cache_matches_full_forward(architecture):
    torch.manual_seed(0)
    config = GPTConfig(architecture=architecture, vocab_size=64, sequence_length=16, n_layer=2, n_head=2, n_embd=32)
    model = build_model(config)
    idx = torch.randint(0, 64, (2, 16))
    logits, loss = model(idx, torch.randint(0, 64, (2, 16)), return_logits=True)
    assert logits.shape == (2, 16, 64) and abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.5
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    from buildllm.model.gpt import KVCache

    with torch.no_grad():
        full, _ = model(idx[:, :10], idx[:, :10], return_logits=True)
        cache = KVCache(config.n_layer)
        model(idx[:, :6], cache=cache)
        stepped = [model(idx[:, i : i + 1], cache=cache)[0][:, -1] for i in range(6, 10)]
    for offset, logit in enumerate(stepped):
        torch.testing.assert_close(logit, full[:, 6 + offset], rtol=1e-4, atol=1e-4)


def test_gradient_checkpointing_gives_the_same_gradients():
    config = GPTConfig(vocab_size=64, sequence_length=16, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    plain = build_model(config)
    checkpointed = build_model(config)
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.gradient_checkpointing = True
    idx = torch.randint(0, 64, (2, 16))
    plain(idx, idx)[1].backward()
    checkpointed(idx, idx)[1].backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_tokenize_vocab_size_is_the_models_vocabulary_too():
    config = load_config(None, {"tokenize.vocab_size": 8192})
    assert profile_for(config).model.vocab_size == 8192


def test_modern_architecture_with_an_odd_head_size_is_refused():
    from buildllm.errors import ConfigError
    from buildllm.plan.run_plan import make_plan

    config = load_config(None, {"device": "cpu", "model.architecture": "modern", "model.n_embd": 60, "model.n_head": 4})
    with pytest.raises(ConfigError, match="even head size"):
        make_plan(config)


@pytest.mark.parametrize(
    "preset, architecture, tied, expected",
    [("tiny", "classic", False, 0.636e6), ("tiny", "modern", True, 0.369e6), ("student", "modern", True, 2.6e6)],
)
def test_presets_as_the_hardware_guide_lists_them(preset, architecture, tied, expected):
    model = profile_for(load_config(None, {"preset": preset, "model.architecture": architecture})).model
    built = build_model(model, "meta")
    assert model.tied_output is tied and (built.lm_head.weight is built.token_embedding.weight) is tied
    assert abs(built.num_parameters() - expected) / expected <= 0.02, built.num_parameters()


def test_student_is_modern_and_the_iterations_stay_tied():
    assert profile_for(load_config(None, {"preset": "student"})).model.architecture == "modern"
    for name in ("gpt_first_cpu", "gpt_42m", "gpt_100m", "small"):
        assert load_profile(name).model.tied_output, name


def _old_tiny_checkpoint(tmp_path):
    """A checkpoint of the old tiny preset: tied, saved before GPTConfig had tied_output."""
    from dataclasses import asdict

    from buildllm.train import checkpoint

    old = GPTConfig(**{**vars(load_profile("tiny").model), "tied_output": True})
    model = build_model(old, seed=3)
    model_config = {k: v for k, v in asdict(old).items() if k != "tied_output"}
    signature = {"profile": "tiny", **{f"model.{k}": v for k, v in model_config.items()}}
    state = {"step": 2, "model": model.state_dict(), "model_config": model_config, "signature": signature}
    checkpoint.save(tmp_path / "run", state, keep=2)
    return model, signature


def test_an_old_tied_tiny_checkpoint_still_loads_and_generates_the_same(tmp_path):
    from buildllm.train.checkpoint import list_checkpoints
    from buildllm.train.generate import load_model

    old, _ = _old_tiny_checkpoint(tmp_path)
    loaded, _ = load_model(list_checkpoints(tmp_path / "run")[-1], "cpu")
    assert loaded.lm_head.weight is loaded.token_embedding.weight
    idx = torch.randint(0, old.config.vocab_size, (1, 8))
    torch.testing.assert_close(loaded(idx)[0], old.eval()(idx)[0])


def test_resuming_an_old_tiny_checkpoint_as_the_new_tiny_is_refused_in_one_line(tmp_path):
    from buildllm.errors import UserError
    from buildllm.train import checkpoint

    _, signature = _old_tiny_checkpoint(tmp_path)
    new = {**signature, "model.tied_output": False}
    with pytest.raises(UserError) as excinfo:
        checkpoint.state_to_resume(tmp_path / "run", new, resume=True, force=True)
    message = str(excinfo.value)
    assert "different model" in message and "model.tied_output True -> False" in message and "\n" not in message
