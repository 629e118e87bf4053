"""The recipe: the optimizer (AdamW, or Muon on the hidden matrices and AdamW on the rest), the
schedule (cosine or wsd), their decisions and reasons, and what a Muon run keeps and estimates."""

from __future__ import annotations

import math

import pytest
import torch

from buildllm.config import load_config, profile_for
from buildllm.errors import ConfigError
from buildllm.memory.estimate import FP32, plan_memory
from buildllm.model.gpt import build_model
from buildllm.plan.optimizer_groups import split_parameters
from buildllm.plan.run_plan import facts, make_plan
from buildllm.shape import GPTConfig
from buildllm.train.optimizer import build_optimizers
from buildllm.train.schedule import make_schedule


def plan_of(**settings):
    return make_plan(load_config(None, {"device": "cpu", "train.training_examples": 320, **settings}))


def test_wsd_warms_up_holds_the_peak_then_decays_linearly_to_the_floor():
    schedule = make_schedule(1.0, total_steps=100, warmup_steps=None, min_ratio=0.1, kind="wsd", decay_fraction=0.2)
    assert (schedule.warmup_steps, schedule.decay_steps) == (5, 20)
    assert [round(schedule.rate(s), 6) for s in range(5)] == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert all(schedule.rate(s) == 1.0 for s in range(5, 80))  # the stable phase
    decay = [schedule.rate(s) for s in range(80, 100)]
    steps = [a - b for a, b in zip(decay, decay[1:])]
    assert max(steps) - min(steps) < 1e-12 and steps[0] > 0  # linear
    assert schedule.rate(99) == pytest.approx(0.1) and schedule.rate(500) == pytest.approx(0.1)


def test_cosine_stays_the_classic_curve():
    schedule = make_schedule(2.0, total_steps=100, warmup_steps=10, min_ratio=0.1)
    for step in (10, 30, 55, 99):
        progress = (step - 10) / 90
        expected = 0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi * progress))
        assert schedule.rate(step) == pytest.approx(expected)
    assert schedule.factor(55) == pytest.approx(schedule.rate(55) / 2.0)


def test_wsd_never_decays_into_the_warm_up():
    schedule = make_schedule(1.0, total_steps=10, warmup_steps=8, min_ratio=0.0, kind="wsd", decay_fraction=0.5)
    assert schedule.decay_steps == 2 and schedule.rate(7) == 1.0 and schedule.rate(9) == 0.0


def test_the_recipe_and_each_override_is_decided_with_its_reason():
    default = plan_of(preset="tiny")
    assert (default.recipe.name, default.recipe.optimizer, default.recipe.schedule) == ("muon", "muon", "wsd")
    assert default.decisions["recipe"] == "muon: profile tiny's cpu default"
    assert (default.learning_rate, default.recipe.muon_learning_rate) == (1e-2, 5e-3)
    classic = plan_of(preset="tiny", **{"train.recipe": "classic"})
    assert (classic.recipe.name, classic.recipe.optimizer, classic.recipe.schedule) == ("classic", "adamw", "cosine")
    assert classic.decisions["recipe"] == "requested: classic"
    assert classic.recipe.muon_learning_rate is None and classic.recipe.decay_fraction is None
    mixed = plan_of(preset="tiny", **{"train.recipe": "classic", "train.optimizer": "muon", "train.schedule": "wsd"})
    assert mixed.recipe.optimizer == "muon" and mixed.decisions["optimizer"].startswith("requested: muon")
    # No Muon rate anywhere: AdamW's carries over (AdamW-matched scale), and the record says so.
    assert mixed.recipe.muon_learning_rate == mixed.learning_rate == 2e-3
    assert "AdamW's" in mixed.decisions["muon_learning_rate"]
    assert mixed.recipe.decay_fraction == 0.2 and mixed.decisions["decay_fraction"] == "0.2: wsd's default"
    muon = plan_of(**{"train.recipe": "muon", "train.muon_learning_rate": 0.01})
    assert muon.recipe.muon_learning_rate == 0.01 and muon.decisions["muon_learning_rate"] == "requested: 0.01"
    assert muon.decisions["learning_rate"].endswith("recipe muon's")


@pytest.mark.parametrize("preset", ["tiny", "student", "small"])
def test_every_preset_learns_by_muon_on_both_devices_and_keeps_classic_one_flag_away(preset):
    # The course compares a preset's CPU and GPU runs: they must learn by one recipe.
    profile = profile_for(load_config(None, {"preset": preset}))
    assert profile.runtime("cpu").recipe == profile.runtime("gpu").recipe == "muon"
    assert plan_of(preset=preset).decisions["recipe"] == f"muon: profile {preset}'s cpu default"
    classic = plan_of(preset=preset, **{"train.recipe": "classic"})
    assert (classic.recipe.optimizer, classic.recipe.schedule) == ("adamw", "cosine")


def test_a_recipe_the_profile_lacks_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="profile gpt_42m has no recipe 'muon' \\(its recipes: classic\\)"):
        plan_of(iteration=2, **{"train.recipe": "muon"})


@pytest.mark.parametrize("preset, tied", [(None, True), ("tiny", False), ("student", True)])
def test_muon_has_the_blocks_matrices_and_adamw_everything_else_once(preset, tied):
    plan = plan_of(preset=preset)
    model = build_model(plan.model, "meta")
    groups = split_parameters(model, "muon")
    names = {key: [n for n, _ in params] for key, params in groups.items()}
    assert all(n.startswith("blocks.") and n.endswith(".weight") for n in names["muon"])
    assert all(p.dim() == 2 for _, p in groups["muon"])
    assert ("lm_head.weight" in names["adamw_decay"]) is not tied  # a tied head is the embedding
    assert "token_embedding.weight" in names["adamw_decay"]
    every = [p for params in groups.values() for _, p in params]
    assert len({id(p) for p in every}) == len(every) and sum(p.numel() for p in every) == plan.parameters
    assert split_parameters(model, "adamw").keys() == {"adamw_decay", "adamw_no_decay"}


def test_the_startup_facts_say_which_parameters_each_optimizer_has():
    plan = plan_of(**{"train.recipe": "muon"})
    line = facts(plan)
    assert line["muon_parameters"] + line["adamw_parameters"] == plan.parameters
    assert line["muon_parameters"] == 4 * (128 * 384 + 128 * 128 + 2 * 128 * 512)  # qkv, proj, up, down
    assert line["optimizer_groups_reason"].startswith("muon: 786,432 parameters in 16 tensors (blocks.N.attn.qkv")
    assert "token_embedding.weight" in line["optimizer_groups_reason"]
    assert (line["optimizer"], line["schedule"], line["muon_learning_rate"]) == ("muon", "wsd", 5e-3)


def test_the_memory_estimate_counts_one_muon_buffer_instead_of_two_adamw_moments():
    adamw, muon = plan_of(**{"train.recipe": "classic"}), plan_of(**{"train.optimizer": "muon"})
    assert muon.muon_parameters > 0 and adamw.muon_parameters == 0
    assert plan_memory(adamw).optimizer - plan_memory(muon).optimizer == muon.muon_parameters * FP32


def test_both_optimizers_step_at_their_peak_times_the_schedules_factor():
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=64, sequence_length=16, n_layer=2, n_head=2, n_embd=32))
    optimizers = build_optimizers(model, "muon", 1e-3, 5e-3, 0.1, fused=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = torch.randint(0, 64, (4, 16))
    model(idx, idx)[1].backward()
    optimizers.step()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if n.endswith("weight"))
    muon_state = optimizers.parts["muon"].state
    assert len(muon_state) == 2 * 4 and all(set(s) == {"momentum_buffer"} for s in muon_state.values())
    assert {g["name"]: g["peak_lr"] for g in optimizers.param_groups} == {
        "adamw_decay": 1e-3,
        "adamw_no_decay": 1e-3,
        "muon": 5e-3,
    }


def test_an_adamw_checkpoint_from_before_muon_still_loads():
    model = build_model(GPTConfig(vocab_size=64, sequence_length=16, n_layer=1, n_head=2, n_embd=32))
    old = build_optimizers(model, "adamw", 1e-3, None, 0.1, fused=False)
    flat = old.parts["adamw"].state_dict()  # what a checkpoint held before: one AdamW's state dict
    fresh = build_optimizers(model, "adamw", 1e-3, None, 0.1, fused=False)
    fresh.load_state_dict(flat)
    with pytest.raises(ValueError, match="the checkpoint's optimizers are \\['adamw'\\], this run's"):
        build_optimizers(model, "muon", 1e-3, 1e-3, 0.1, fused=False).load_state_dict(flat)


def test_every_profile_has_the_classic_baseline_and_its_defaults_name_its_own_recipes():
    from buildllm.profiles import available_profiles, load_profile

    for name in available_profiles():
        profile = load_profile(name)
        assert profile.recipes["classic"].optimizer == "adamw" and profile.recipes["classic"].schedule == "cosine"
        assert {profile.cpu.recipe, profile.gpu.recipe} <= set(profile.recipes), name
