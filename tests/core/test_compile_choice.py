"""`train.compile`: true, false, or auto from measured figures; and the CPU's bf16 advice."""

from __future__ import annotations

from types import SimpleNamespace

from buildllm.cli import build_parser, config_from_args
from buildllm.config import load_config
from buildllm.device.cpu_bf16 import precision_advice
from buildllm.plan import make_plan
from buildllm import compile_choice
from buildllm.compile_choice import decide_compile

FIGURES = {"student": {"cpu": {"speedup": 1.5, "compile_seconds": 30.0, "plain_step_seconds": 0.3,
                               "precision": "fp32", "source": "scripts/compile_gain.py, test figures"}},
           "small": {"cpu": {"speedup": 0.97, "compile_seconds": 40.0, "plain_step_seconds": 0.9,
                             "precision": "fp32", "source": "test figures"}}}


def test_true_and_false_are_obeyed_whatever_was_measured():
    assert decide_compile("true", "small", "cpu", 10, figures=FIGURES).enabled
    assert not decide_compile("false", "student", "cpu", 10**6, figures=FIGURES).enabled


def test_auto_compiles_only_when_the_gain_pays_back_the_compile_time_within_the_run():
    # 0.3 s/step at x1.5 saves 0.1 s a step: 30 s of compilation pay back after 300 steps.
    short = decide_compile("auto", "student", "cpu", 299, figures=FIGURES)
    long = decide_compile("auto", "student", "cpu", 300, figures=FIGURES)
    assert not short.enabled and long.enabled
    assert "pays back after 300 steps" in long.reason and "plans 300" in long.reason
    assert "x1.50" in long.reason and "test figures" in long.reason  # the figures and their source
    slower = decide_compile("auto", "small", "cpu", 10**6, figures=FIGURES)
    assert not slower.enabled and "no gain" in slower.reason
    unknown = decide_compile("auto", "student", "cuda", 10**6, figures=FIGURES)
    assert not unknown.enabled and "never measured" in unknown.reason
    dry = decide_compile("auto", "student", "cpu", None, figures=FIGURES)
    assert not dry.enabled and "at least 300 steps" in dry.reason


def test_a_measurement_applies_to_its_profiles_default_shape_only(monkeypatch):
    monkeypatch.setattr(compile_choice, "measurements", lambda: FIGURES)
    default = make_plan(load_config(None, {"preset": "student", "device": "cpu"}), training_examples=10**6)
    # The plan decides with the steps it plans (a million examples of the profile's batch).
    assert default.compile.enabled and default.decisions["compile"] == default.compile.reason
    changed = make_plan(load_config(None, {"preset": "student", "device": "cpu", "train.batch_size": 3}),
                        training_examples=10**6)
    assert not changed.compile.enabled and "changes them" in changed.compile.reason


def test_the_stored_measurements_carry_figures_and_their_source():
    for profile, kinds in compile_choice.measurements().items():
        for kind, entry in kinds.items():
            assert entry["compile_seconds"] >= 0 and entry["speedup"] > 0 and entry["plain_step_seconds"] > 0
            assert entry["source"].startswith("scripts/compile_gain.py"), (profile, kind)


def test_the_flag_takes_a_value_or_stands_alone_for_true():
    parser = build_parser()
    for argv, expected in ((["train", "--compile"], "true"), (["train", "--compile", "auto"], "auto"),
                           (["train", "--compile", "false"], "false"), (["train"], "auto")):
        args = parser.parse_args(argv + ["--params", "no-such-params.yaml"])
        args.params = None
        assert config_from_args(args).train.compile == expected
    assert load_config(None, {"train.compile": True}).train.compile == "true"  # YAML's true


def test_bf16_advice_only_on_a_cpu_with_native_bf16_and_quotes_the_measurement():
    figures = {"student": {"bf16_speedup": 1.21, "source": "scripts/bf16_gain.py, test figures"}}
    plan = make_plan(load_config(None, {"preset": "student", "device": "cpu"}))
    advice = precision_advice(plan, native=True, figures=figures)
    assert "natively" in advice and "x1.21" in advice and "test figures" in advice and "fp32 stays" in advice
    assert precision_advice(plan, native=False, figures=figures) == ""
    assert "not measured" in precision_advice(plan, native=True, figures={})
    cuda = SimpleNamespace(device=SimpleNamespace(kind="cuda"))
    assert precision_advice(cuda, native=True, figures=figures) == ""
