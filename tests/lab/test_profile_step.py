"""lab/profile_step.py: a real step profiled by operator group, in one precision or two taking turns."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from lab import profile_step


@pytest.fixture
def script(monkeypatch):
    module = profile_step
    threads = torch.get_num_threads()  # the script's plans set torch's threads in this process
    yield module
    torch.set_num_threads(threads)


def table(out: str) -> dict[str, list[str]]:
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("group", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def run_main(script, monkeypatch, *flags) -> str:
    monkeypatch.setattr(sys, "argv", ["profile_step.py", "--profile", "tiny", "--warmup", "1", *flags])
    script.main()


def test_two_precisions_take_turns_and_the_table_gives_each_group_both_and_their_ratio(
    script, monkeypatch, capsys, cpu_with_bf16
):
    # The bf16 side's matmuls take this CPU's own kernel (slow where it has no bf16 path): tiny, one step.
    run_main(script, monkeypatch, "--precision", "fp32", "bf16", "--rounds", "2", "--steps", "1", "--top", "3")
    out = capsys.readouterr().out
    assert re.search(r"2 round\(s\) of 1 profiled steps per precision: fp32 \d+ ms/step, bf16 \d+ ms/step", out)
    rows = table(out)
    assert {label for label, _ in script.GROUPS} | {"the rest", "total"} == set(rows)
    total = {p: float(rows["total"][i]) for i, p in ((0, "fp32"), (2, "bf16"))}
    for label, cells in rows.items():
        if label == "total":
            continue
        fp32, bf16 = float(cells[0]), float(cells[2])
        assert fp32 >= 0 and bf16 >= 0 and len(cells) == 5, (label, cells)
        if fp32 >= 5:  # the printed milliseconds are rounded to 0.1 (bf16's by up to 0.05), the ratio to 0.01
            assert float(cells[4]) == pytest.approx(bf16 / fp32, rel=0.05, abs=0.005 + 0.05 / fp32), (label, cells)
    assert sum(float(c[0]) for k, c in rows.items() if k != "total") == pytest.approx(total["fp32"], abs=0.1 * 11)
    # Autocast casts the weights and activations to bf16: the table shows that cost on the bf16 side.
    # Not compared with fp32's own casts (its data's dtype moves): one profiled step of each, timed on a
    # shared machine, ordered them either way (fp32 2.2 ms against bf16 0.5 ms once in the full suite).
    assert float(rows["casts (_to_copy)"][2]) > 0
    assert out.count("top 3 operators") == 2


def test_bf16_is_refused_where_the_cpu_has_no_bf16_path(script, monkeypatch, capsys):
    from buildllm.device import cpu_bf16

    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: False)
    with pytest.raises(SystemExit) as refused:
        run_main(script, monkeypatch, "--precision", "fp32", "bf16")
    assert refused.value.code == 2 and "no bf16 matmul path" in capsys.readouterr().err
