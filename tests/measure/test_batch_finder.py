"""The batch-size finder on the CPU: real tries in child processes against a small memory budget."""

from __future__ import annotations

import json

import pytest
import yaml

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.errors import ConfigError
from buildllm.units import parse_size


def test_parse_size():
    assert parse_size("4GiB") == 4 * 2**30
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size(".5KiB") == 512
    assert parse_size("8000000000") == 8_000_000_000
    for text in ("lots", "4 parsecs", ".GiB", ".", "1.2.3GB", "-4GiB", "nan", "inf", ""):
        assert parse_size(text) is None, text


@pytest.mark.parametrize(
    "budget, fragment",
    [
        ("12 parsecs", "benchmark.memory_budget='12 parsecs' is not a size; write e.g. 4GiB, 512MiB or 8000000000"),
        (".GiB", "benchmark.memory_budget='.GiB' is not a size"),
        ("0", "benchmark.memory_budget='0' is no memory at all; give a positive size"),
        ("0 GiB", "benchmark.memory_budget='0 GiB' is no memory at all"),
    ],
)
@pytest.mark.parametrize("find", [True, False])
def test_a_budget_that_is_not_a_size_is_one_line_with_or_without_the_finder(
    tokens, workdir, capsys, budget, fragment, find
):
    """Checked where it is given, whichever command reads it: not only when --find-batch-size runs."""
    args = finder(tokens, budget)
    assert main(args if find else [a for a in args if a != "--find-batch-size"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {fragment}"), err
    assert "Traceback" not in err and not (workdir / "metrics").exists()


@pytest.mark.parametrize("value", ["12 parsecs", 0, True])
def test_params_yaml_memory_budget_is_checked_on_load(tmp_path, value):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"benchmark": {"memory_budget": value}}))
    with pytest.raises(ConfigError, match="benchmark.memory_budget="):
        load_config(tmp_path / "params.yaml")


def test_params_yaml_memory_budget_may_be_a_plain_byte_count(tmp_path):
    (tmp_path / "params.yaml").write_text("benchmark:\n  memory_budget: 8000000000\n")
    assert parse_size(load_config(tmp_path / "params.yaml").benchmark.memory_budget) == 8_000_000_000


def finder(tokens, budget: str) -> list[str]:
    # Sequence 256 makes each example's logits 16 MiB, so batch sizes 1, 2, 4 differ clearly in memory.
    return [
        "benchmark",
        "--find-batch-size",
        "--memory-budget",
        budget,
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--sequence-length",
        "256",
        "--train-tokens",
        str(tokens["train"]),
        "--validation-tokens",
        str(tokens["validation"]),
        "--validation-examples",
        "8",
    ]


def tries(result: dict) -> list[tuple[int, bool, int]]:
    return [
        (result[f"try_{i}_batch_size"], result[f"try_{i}_fits"], result[f"try_{i}_peak_bytes"])
        for i in range(result["tries"])
    ]


def test_finds_the_largest_batch_within_the_budget(tokens, workdir, capsys):
    assert main(finder(tokens, "100MiB")) == 0
    out = capsys.readouterr().out
    result = json.loads((workdir / "metrics" / "batch_size.json").read_text())
    assert result["memory_budget_bytes"] == 100 * 2**20 and result["usable_bytes"] == int(100 * 2**20 * 0.9)
    found, usable, attempts = result["found_batch_size"], result["usable_bytes"], tries(result)
    assert found >= 1 and attempts[0][0] == 1
    # Every try is reported as it happens, one JSON line each.
    reported = [json.loads(line) for line in out.splitlines() if line.startswith('{"try_batch_size"')]
    assert [(r["try_batch_size"], r["fits"]) for r in reported] == [(b, f) for b, f, _ in attempts]
    # The answer fitted with its measured peak under the usable budget; every larger try failed;
    # every smaller one fitted: the search brackets the answer.
    assert (found, True) in [(b, f) for b, f, _ in attempts]
    assert all(0 < peak <= usable for b, fits, peak in attempts if fits)
    larger = [fits for b, fits, _ in attempts if b > found]
    assert larger and not any(larger)
    assert all(fits for b, fits, _ in attempts if b <= found)
    assert f"largest batch size that fits: {found}" in out and f"--batch-size {found}" in out


def test_says_so_and_fails_when_even_one_example_does_not_fit(tokens, workdir, capsys):
    assert main(finder(tokens, "10MiB")) == 2
    err = capsys.readouterr().err
    result = json.loads((workdir / "metrics" / "batch_size.json").read_text())  # the try's figures are kept
    assert result["found_batch_size"] == 0 and result["tries"] == 1 and result["try_0_fits"] is False
    assert err.strip().splitlines() == [
        "error: even batch size 1 does not fit in 9 MiB (10% safety margin of 10 MiB); use a smaller profile, "
        "--gradient-checkpointing, or a larger --memory-budget"
    ]
