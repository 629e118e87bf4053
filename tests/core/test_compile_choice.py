"""`train.compile`: true, false, or auto from this machine's tune figures; and the CPU's bf16 advice."""

from __future__ import annotations

from importlib import resources
from types import SimpleNamespace

from buildllm.cli import build_parser, config_from_args
from buildllm.config import load_config
from buildllm.device import cpu_bf16
from buildllm.device.cpu_bf16 import precision_advice
from buildllm.plan import tuned
from buildllm.plan.compile import decide_compile
from buildllm.plan.run_plan import make_plan

# 0.3 s/step at x1.4 (the interval's low end) saves 0.0857 s a step: 30 s of compilation pay back after 351 steps.
PAYS = {
    "speedup": 1.5,
    "low": 1.4,
    "high": 1.6,
    "coverage": 0.97,
    "compile_seconds": 30.0,
    "plain_step_seconds": 0.3,
    "precision": "fp32",
    "pairs": 6,
}
SLOWER = {"speedup": 0.97, "compile_seconds": 40.0, "plain_step_seconds": 0.9, "precision": "fp32", "pairs": 6}


def test_true_and_false_are_obeyed_whatever_was_measured():
    assert decide_compile("true", 10, measured=SLOWER).enabled
    assert not decide_compile("false", 10**6, measured=PAYS).enabled


def test_auto_compiles_only_when_the_gain_measured_here_pays_back_the_compile_time_within_the_run():
    short, long = decide_compile("auto", 350, measured=PAYS), decide_compile("auto", 351, measured=PAYS)
    assert not short.enabled and long.enabled
    assert "pays back after 351 steps" in long.reason and "plans 351" in long.reason
    assert (
        "measured here: x1.50" in long.reason
        and "6 pairs" in long.reason
        and "x1.40 at its interval's low end" in long.reason
    )
    # At the median (x1.5) the same figures would pay back after 300 steps: not enough.
    assert not decide_compile("auto", 300, measured=PAYS).enabled
    slower = decide_compile("auto", 10**6, measured=SLOWER)
    assert not slower.enabled and "no gain" in slower.reason
    dry = decide_compile("auto", None, measured=PAYS)
    assert not dry.enabled and "at least 351 steps" in dry.reason
    noisy = decide_compile("auto", 10**6, measured={**PAYS, "low": 0.9, "pairs": 4, "coverage": 0.875})
    assert not noisy.enabled and "not conclusively faster (interval 0.90-1.60)" in noisy.reason
    other_precision = decide_compile("auto", 10**6, "bf16", measured=PAYS)
    assert not other_precision.enabled and "computes in bf16" in other_precision.reason


def test_auto_without_figures_of_this_machine_does_not_compile_and_says_how_to_measure():
    unknown = decide_compile("auto", 10**6, measured=None, missing=tuned.NOT_MEASURED)
    assert not unknown.enabled
    assert "not measured on this machine: run `buildllm tune`" in unknown.reason


def test_no_package_data_holds_one_machines_measurements():
    for package in ("buildllm", "buildllm.device", "buildllm.train"):
        names = [entry.name for entry in resources.files(package).iterdir()]
        assert not [n for n in names if n.endswith("_measurements.yaml")], (package, names)


def test_the_flag_takes_a_value_or_stands_alone_for_true():
    parser = build_parser()
    for argv, expected in (
        (["train", "--compile"], "true"),
        (["train", "--compile", "auto"], "auto"),
        (["train", "--compile", "false"], "false"),
        (["train"], "auto"),
    ):
        args = parser.parse_args(argv + ["--params", "no-such-params.yaml"])
        args.params = None
        assert config_from_args(args).train.compile == expected
    assert load_config(None, {"train.compile": True}).train.compile == "true"  # YAML's true


def test_bf16_advice_on_the_cpu_points_to_tune_or_says_bf16_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no metrics/tune.json here
    plan = make_plan(load_config(None, {"preset": "student", "device": "cpu"}))
    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: True)
    advice = precision_advice(plan)
    assert "oneDNN" in advice and "buildllm tune" in advice and "fp32 stays" in advice
    assert "not measured on this machine" in advice  # the plan's reason, quoted
    cuda = SimpleNamespace(device=SimpleNamespace(kind="cuda"))
    assert precision_advice(cuda) == ""
    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: False)
    without = precision_advice(plan)
    assert "no bf16 matmul path" in without and "bf16 is refused" in without
