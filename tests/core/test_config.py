import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildllm.cli import main
from buildllm.config import Config, defaults_dict, load_config
from buildllm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_params_yaml_holds_exactly_the_config_defaults():
    # params.yaml is the documented face of the config: same keys, same defaults.
    assert yaml.safe_load((ROOT / "params.yaml").read_text()) == defaults_dict()


def test_missing_file_gives_defaults_and_overrides_apply(tmp_path):
    config = load_config(tmp_path / "params.yaml" if False else None, {"train.batch_size": 8, "device": "cpu"})
    assert config.train.batch_size == 8 and config.device == "cpu"
    assert config.iteration == Config().iteration


def write(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("iteration: 4\n", "iteration=4 is not allowed; allowed values: 1, 2, 3"),
        ("train:\n  batch_size: -2\n", "train.batch_size=-2 is too small"),
        ("train:\n  batch_sise: 2\n", "unknown key train.batch_sise"),
        ("colour: red\n", "unknown key colour"),
        ("device: tpu\n", "device='tpu' is not a device; allowed: auto, cpu, cuda, cuda:N, mps, xla"),
        ("precision: fp8\n", "precision='fp8' is not allowed; allowed values: auto, fp32, bf16, fp16"),
        ("train:\n  epochs: two\n", "train.epochs='two' has the wrong type; it must be an integer"),
        ("train:\n  compile: 1\n", "train.compile=1 is not allowed; allowed values: false, true, auto"),
        ("train:\n  compile: maybe\n", "train.compile='maybe' is not allowed; allowed values: false, true, auto"),
        ("train: 5\n", "train must be a section"),
        ("preset: huge\n", "allowed values: tiny, student, small"),
        ("iteration: [\n", "is not valid YAML"),
    ],
)
def test_bad_values_name_key_value_and_allowed(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as excinfo:
        load_config(write(tmp_path, text))
    assert fragment in str(excinfo.value)


def test_yaml_scientific_notation_is_a_float(tmp_path):
    config = load_config(write(tmp_path, "train:\n  learning_rate: 3e-4\n"))
    assert config.train.learning_rate == pytest.approx(3e-4)


def test_cli_bad_value_is_one_line_exit_2_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "buildllm", "dry-run", "--iteration", "4"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "iteration=4" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("text", [".nan", "nan", ".inf", "-.inf", "inf"])
def test_every_float_knob_refuses_a_non_finite_value(tmp_path, text):
    from buildllm.knob import base_type, leaf_knobs

    floats = [key for key, _, hint in leaf_knobs(Config) if base_type(hint) is float]
    assert "train.learning_rate" in floats
    for key in floats:
        *parents, leaf = key.split(".")
        body = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents)) + f"{'  ' * len(parents)}{leaf}: {text}\n"
        with pytest.raises(ConfigError) as excinfo:
            load_config(write(tmp_path, body))
        assert f"{key}=" in str(excinfo.value) and "not a finite number" in str(excinfo.value)


def test_cli_non_finite_learning_rate_is_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "buildllm", "train", "--learning-rate", "nan"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "train.learning_rate=nan is not a finite number" in result.stderr


def test_cli_flags_override_params_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "train:\n  batch_size: 4\n")
    assert main(["dry-run", "--device", "cpu", "--batch-size", "6"]) == 0
    import json

    metrics = json.loads((tmp_path / "metrics" / "dry_run.json").read_text())
    assert metrics["batch_size"] == 6


@pytest.mark.parametrize(
    "text, said",
    [
        (
            "train:\n  batch_size: 8\n   epochs: 2\n",
            "line 3, column 10 (`   epochs: 2`): mapping values are not allowed here",
        ),
        (
            "seed: 1\ntrain: [a\n",
            "line 3, column 1: expected ',' or ']', but got '<stream end>', while parsing a "
            "flow sequence opened on line 2",
        ),
        ("seed: 1\n\tdevice: cpu\n", "line 2, column 1 (`\tdevice: cpu`): found character '\\t' that cannot start"),
    ],
)
def test_invalid_yaml_names_the_file_line_and_column(tmp_path, capsys, text, said):
    path = write(tmp_path, text)
    assert main(["dry-run", "--params", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path} is not valid YAML: {said}"), lines
    assert lines[0].endswith("; fix it there")


def test_a_params_file_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_bytes(b"seed: 1\ntrain:\n  batch_size: 8\xff\n")
    with pytest.raises(ConfigError, match=r"params.yaml is not UTF-8 text \(byte 0xff on line 3\); save it as UTF-8"):
        load_config(path)
