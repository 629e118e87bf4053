"""lab/side_by_side.py: which fresh processes it runs in which order, the summary table, the
verdicts and the exit code, the JSON; and once for real, on a stand-in for nanoGPT's model.py.

The stand-in is this file's own least nanoGPT-shaped model (GPTConfig, GPT(config) whose forward
returns (logits, loss), configure_optimizers): nanoGPT's code is never part of the repository. No
assertion here depends on a measured speed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from buildllm.device import cpu_bf16
from lab import side_by_side

ROOT = Path(__file__).resolve().parents[2]

REFERENCE = """
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 256
    n_layer: int = 1
    n_head: int = 1
    n_embd: int = 16
    dropout: float = 0.0
    bias: bool = True


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=config.bias)

    def forward(self, idx, targets=None):
        logits = self.head(self.wte(idx) + self.wpe(torch.arange(idx.size(1))))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
"""

# The fake processes' tokens/s: ours/nanoGPT 1.3 at both precisions, our bf16/fp32 1.2.
RATES = {
    ("ours", "fp32"): 1300.0,
    ("reference", "fp32"): 1000.0,
    ("ours", "bf16"): 1560.0,
    ("reference", "bf16"): 1200.0,
}


@pytest.fixture
def reference(tmp_path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(REFERENCE)
    return path


@pytest.fixture
def script(monkeypatch):
    """The script as a module, its fresh processes replaced by RATES; `script.calls` lists them in order."""
    module = side_by_side
    monkeypatch.setattr(module, "calls", [], raising=False)

    def in_fresh_process(args, side, profile, precision, work):
        module.calls.append((profile, side, precision, work))
        rate = RATES[side, precision]
        return {"side": side, "tokens_per_second": rate, "intervals": [rate], "seconds": 0.0}

    monkeypatch.setattr(module, "in_fresh_process", in_fresh_process)
    threads = torch.get_num_threads()  # the script's plans set torch's threads in this process
    yield module
    torch.set_num_threads(threads)


def run_main(script, monkeypatch, reference, *flags) -> int:
    monkeypatch.setattr(sys, "argv", ["side_by_side.py", str(reference), *flags])
    with pytest.raises(SystemExit) as exit:
        script.main()
    return exit.value.code


def summary(out: str) -> dict[tuple[str, str, str], list[str]]:
    """The summary table's rows, by (profile, precision, comparison): the rest of their cells."""
    lines = out[out.index("\nsummary") :].splitlines()[2:]
    header = re.split(r"\s{2,}", lines[0].strip())
    assert header[:3] == ["profile", "precision", "comparison"] and header[-2:] == ["target", "verdict"]
    rows = {}
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == len(header):
            rows[tuple(cells[:3])] = cells[3:]
    return rows


def test_both_precisions_interleave_neighbouring_pairs_and_a_missed_target_exits_1(
    script, monkeypatch, reference, tmp_path, capsys, cpu_with_bf16
):
    out_file = tmp_path / "out" / "result.json"
    flags = ("--profile", "tiny", "small", "--pairs", "2", "--json-out", str(out_file))
    assert run_main(script, monkeypatch, reference, *flags) == 1  # small's bf16/fp32 target is 1.5
    out = capsys.readouterr().out
    order = [("reference", "fp32"), ("ours", "fp32"), ("ours", "bf16"), ("reference", "bf16")]
    for profile in ("tiny", "small"):
        made = [(side, precision) for p, side, precision, _ in script.calls if p == profile]
        assert made == order + order[::-1]  # several profiles: both precisions by default
    assert {work for p, *_, work in script.calls if p == "small"} == {script.WORK["small"]}
    start = json.loads(out.splitlines()[0])
    assert start["profiles"] == ["tiny", "small"] and start["precisions"] == ["fp32", "bf16"]
    assert set(start["cpu"]) == {"model", "kind", "amx_bf16", "avx512_bf16"} and start["processes"] == 16
    assert "rough estimate" in out.splitlines()[1]
    assert "== small fp32 and bf16" in out and "small bf16/fp32 (ours) pair 2/2: bf16 1,560 tokens/s" in out
    rows = summary(out)
    assert rows == {
        ("tiny", "fp32", "ours/nanoGPT"): ["1,300", "1,000", "1.300", "1.300", "1.300", "2", "1.00", "met"],
        ("tiny", "bf16", "ours/nanoGPT"): ["1,560", "1,200", "1.300", "1.300", "1.300", "2", "1.00", "met"],
        ("tiny", "bf16", "bf16/fp32 (ours)"): ["1,560", "1,300", "1.200", "1.200", "1.200", "2", "-", "report only"],
        ("small", "fp32", "ours/nanoGPT"): ["1,300", "1,000", "1.300", "1.300", "1.300", "2", "1.20", "met"],
        ("small", "bf16", "ours/nanoGPT"): ["1,560", "1,200", "1.300", "1.300", "1.300", "2", "1.00", "met"],
        ("small", "bf16", "bf16/fp32 (ours)"): ["1,560", "1,300", "1.200", "1.200", "1.200", "2", "1.50", "MISSED"],
    }
    result = json.loads(out_file.read_text())
    assert result["passed"] is False and len(result["rows"]) == 6 and len(result["measurements"]) == 16
    assert result["rows"][5]["pair_ratios"] == pytest.approx([1.2, 1.2])
    assert [p.name for p in out_file.parent.iterdir()] == ["result.json"]  # no temp file left beside it


def test_one_profile_keeps_fp32_ours_then_reference_and_target_overrides(script, monkeypatch, reference, capsys):
    assert run_main(script, monkeypatch, reference, "--profile", "tiny", "--pairs", "2", "--steps", "3") == 0
    assert [(side, precision) for _, side, precision, _ in script.calls] == [
        ("ours", "fp32"),
        ("reference", "fp32"),
    ] * 2
    assert {work for *_, work in script.calls} == {(script.WORK["tiny"][0], 3, script.WORK["tiny"][2])}
    assert list(summary(capsys.readouterr().out)) == [("tiny", "fp32", "ours/nanoGPT")]
    assert run_main(script, monkeypatch, reference, "--profile", "tiny", "--pairs", "1", "--target", "1000") == 1
    assert summary(capsys.readouterr().out)[("tiny", "fp32", "ours/nanoGPT")][-2:] == ["1000.00", "MISSED"]


def test_all_is_the_cpu_profiles_at_both_precisions_and_turns_takes_one(
    script, monkeypatch, reference, capsys, cpu_with_bf16
):
    assert run_main(script, monkeypatch, reference, "--profile", "all", "--pairs", "1") == 1  # small's 1.5
    rows = summary(capsys.readouterr().out)
    assert [key[0] for key in rows][::3] == ["iteration1", "tiny", "student", "small"]
    assert len(rows) == 12 and rows[("iteration1", "bf16", "bf16/fp32 (ours)")][-2:] == ["1.20", "met"]
    assert run_main(script, monkeypatch, reference, "--profile", "tiny", "--precision", "both", "--turns") == 2
    assert "--turns measures one profile at one precision" in capsys.readouterr().err


def test_a_cpu_without_a_bf16_path_measures_fp32_alone_and_refuses_bf16(script, monkeypatch, reference, capsys):
    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: False)
    assert run_main(script, monkeypatch, reference, "--profile", "tiny", "student", "--pairs", "1") == 0
    out = capsys.readouterr().out
    assert json.loads(out.splitlines()[0])["precisions"] == ["fp32"]  # the start line comes first, as always
    assert "fp32 only: this CPU has no bf16 matmul path" in out.splitlines()[1]
    assert {precision for *_, precision, _ in script.calls} == {"fp32"} and len(script.calls) == 4
    assert list(summary(out)) == [("tiny", "fp32", "ours/nanoGPT"), ("student", "fp32", "ours/nanoGPT")]
    script.calls.clear()
    assert run_main(script, monkeypatch, reference, "--profile", "tiny", "--precision", "bf16") == 2
    assert "no bf16 matmul path" in capsys.readouterr().err and not script.calls


@pytest.mark.slow
def test_a_real_run_on_tiny_against_a_stand_in_reference(reference, tmp_path):
    """Three fresh processes (the script, ours, the reference), a few steps each: 10-15 s, most of it
    starting Python and torch."""
    out_file = tmp_path / "result.json"
    command = [sys.executable, "-m", "lab.side_by_side", str(reference), "--profile", "tiny", "--pairs", "1"]
    command += ["--warmup", "1", "--steps", "1", "--intervals", "1", "--threads", "1", "--target", "1000"]
    done = subprocess.run(
        [*command, "--json-out", str(out_file)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 1, done.stderr  # no training step is 1000 times the other's
    assert re.search(r"tiny fp32 pair 1/1: ours [\d,]+ tokens/s, reference [\d,]+ tokens/s", done.stdout)
    assert summary(done.stdout)[("tiny", "fp32", "ours/nanoGPT")][-3:] == ["1", "1000.00", "MISSED"]
    result = json.loads(out_file.read_text())
    assert [m["side"] for m in result["measurements"]] == ["ours", "reference"]
    assert all(m["tokens_per_second"] > 0 for m in result["measurements"])
