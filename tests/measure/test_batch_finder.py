"""The batch-size finder on the CPU: real tries in child processes against a small memory budget."""

from __future__ import annotations

import json

import pytest

from buildllm.cli import main
from buildllm.errors import ConfigError
from buildllm.measure.batch_finder import parse_bytes


def test_parse_bytes():
    assert parse_bytes("4GiB") == 4 * 2**30
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes("8000000000") == 8_000_000_000
    with pytest.raises(ConfigError, match="benchmark.memory_budget='lots' is not a size; write e.g. 4GiB"):
        parse_bytes("lots")
    with pytest.raises(ConfigError):
        parse_bytes("4 parsecs")


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


def test_says_so_when_even_one_example_does_not_fit(tokens, workdir, capsys):
    assert main(finder(tokens, "10MiB")) == 0
    out = capsys.readouterr().out
    result = json.loads((workdir / "metrics" / "batch_size.json").read_text())
    assert result["found_batch_size"] == 0 and result["tries"] == 1 and result["try_0_fits"] is False
    assert "even batch size 1 does not fit" in out and "--gradient-checkpointing" in out
