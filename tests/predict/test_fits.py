"""`buildllm fits`: the largest batch per profile and precision that the memory model fits in a size."""

from __future__ import annotations

import pytest

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.model.gpt import build_model
from buildllm.plan.memory import estimate_at, largest_batch
from buildllm.predict.fits import GIB, GPU, fits_table
from buildllm.profiles import load_profile


@pytest.mark.parametrize("name, precision_bytes, gib", [("gpt_42m", 2, 24), ("gpt_100m", 4, 16), ("tiny", 2, 8)])
def test_the_largest_batch_fits_and_one_more_does_not(name, precision_bytes, gib):
    model = load_profile(name).model
    parameters = build_model(model, "meta").num_parameters()
    usable = int(gib * GIB * 0.9)
    batch = largest_batch(model, parameters, precision_bytes, usable, GPU)
    assert batch >= 1
    # The estimates the plan would make for those batches, on a device of that memory.
    assert estimate_at(model, parameters, batch, precision_bytes, GPU, usable).total <= usable
    assert estimate_at(model, parameters, batch + 1, precision_bytes, GPU, usable).total > usable


def test_too_little_memory_fits_no_batch():
    model = load_profile("gpt_100m").model
    parameters = build_model(model, "meta").num_parameters()
    assert largest_batch(model, parameters, 4, 1 * GIB, GPU) == 0  # weights and AdamW alone are 1.5 GiB


def test_the_table_grows_with_memory_and_with_half_precision(capsys):
    rows = fits_table(load_config(None))
    assert main(["fits"]) == 0
    out = capsys.readouterr().out
    assert "| gpt_100m | 98.4M | fp32 |" in out and "141 GiB" in out and "here: " in out
    for row in rows:
        sizes = [row[f"{gib} GiB"] for gib in (8, 12, 16, 24, 40, 48, 80, 141)]
        assert sizes == sorted(sizes)
    by = {(r["profile"], r["precision"]): r for r in rows}
    assert by[("gpt_42m", "bf16/fp16")]["24 GiB"] > by[("gpt_42m", "fp32")]["24 GiB"]
    assert [r["profile"] for r in rows][::2] == ["tiny", "gpt_first_cpu", "student", "small", "gpt_42m", "gpt_100m"]
