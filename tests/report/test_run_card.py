"""The run card from a real (tiny) training run, and the comparison's time to a stated loss.

A run that trained but never ran the dry run, benchmark or estimate stages must say "not recorded"
for their figures, never draw a zero; the sample comes from the run's own checkpoint.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from train_fixtures import train_args

from buildllm.cli import main
from buildllm.report.card_data import read_card
from buildllm.report.curves import target_loss, time_to
from buildllm.report.run_card import headline

ROOT = Path(__file__).resolve().parents[2]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def trained(tokens, tmp_path_factory):
    """A 20-step tiny run in a folder of its own (metrics/, plots/ and the checkpoints)."""
    folder = tmp_path_factory.mktemp("card")
    before = Path.cwd()
    try:
        os.chdir(folder)  # metrics/ and plots/ are written relative to the working directory
        assert main(train_args(tokens, folder / "run", "--eval-interval", "4")) == 0
        assert main(["report", "--params", str(params_for(folder, tokens))]) == 0
    finally:
        os.chdir(before)
    return folder


def params_for(folder: Path, paths: dict) -> Path:
    """A params file naming the run's checkpoint directory and tokenizer, as the report stage reads them."""
    import yaml

    from buildllm.config import defaults_dict

    data = defaults_dict()
    data["train"].update(checkpoint_directory=str(folder / "run"), tokenizer=str(paths["tokenizer"]))
    (folder / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "params.yaml"


def test_a_run_without_its_other_stages_says_not_recorded_and_samples_its_checkpoint(trained, monkeypatch):
    monkeypatch.chdir(trained)
    data = read_card()
    assert set(data.records) == {"train"}
    assert data.absent["metrics/dry_run.json"] == data.absent["metrics/machine.json"] == "absent"
    figures = dict(headline(data))
    assert figures["benchmark throughput"] == figures["model FLOPs utilisation (benchmark)"] == "not recorded"
    loss, unigram = data.get("train", "final_validation_loss"), data.get("train", "unigram_validation_loss")
    side = "below" if loss < unigram else "above"  # 20 steps of a tiny model: either, the card must say which
    assert figures["status"] == "completed"
    assert f"{abs(unigram - loss):.3f} nats {side} the unigram level" in figures["loss"]
    sample = json.loads((trained / "metrics" / "sample_notes.json").read_text())
    assert sample["checkpoint_step"] == 20 and sample["text"].startswith("The") and len(sample["text"]) > 10
    page = (trained / "plots" / "run_card.html").read_text()
    assert html.escape(sample["text"].split()[-1]) in page and "metrics/machine.json is absent" in page
    assert "benchmark recorded of it: not recorded (metrics/benchmark.json is absent" in page  # as compare says
    assert page.count("data:image/png;base64,") == 4 and "http://" not in page and "https://" not in page
    width, height = png_size(trained / "plots" / "run_card.png")
    assert width >= 1200 and height > 1000


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs headless Chromium (Debian: apt-get install -y chromium)"
)
def test_the_card_renders_offline_in_chromium(trained, tmp_path):
    shot = tmp_path / "shot.png"
    check = [
        sys.executable,
        str(ROOT / "lab" / "check_report_html.py"),
        str(trained / "plots" / "run_card.html"),
        "--tables",
        "headline",
        "plan",
        "memory",
        "--screenshot",
        str(shot),
    ]
    done = subprocess.run(check, capture_output=True, text=True, timeout=300)
    findings = json.loads(done.stdout)
    assert done.returncode == 0, findings["problems"]
    assert findings["images"] == findings["decoded"] == 4 and findings["fetched"] == []
    for text in (
        "Run card: tiny on cpu (fp32)",
        "Where a step's time goes",
        "The plan: what was decided, and why",
        "not recorded",
        "A sample of its text",
    ):
        assert text in findings["text"], text
    assert "headless Chromium, networking off" in findings["text"]  # the page says how its PNG was drawn
    width, height = png_size(shot)
    assert width == 1280 and height >= 1000 and shot.stat().st_size > 50_000


def test_the_target_loss_is_the_worst_best_and_its_time_the_first_validation_below():
    def rows(*points):
        return [{"step": s, "elapsed_seconds": t, "validation_loss": v, "train_loss": None} for s, t, v in points]

    fast = rows((0, 0.0, 8.0), (10, 5.0, 6.0), (20, 10.0, 5.2), (30, 15.0, 5.1))
    slow = rows((0, 0.0, 8.0), (10, 20.0, 6.5), (20, 40.0, 5.349), (30, 60.0, 5.4))
    assert target_loss({"fast": fast, "slow": slow}) == pytest.approx(5.35)  # slow's best, 5.349, rounded up
    assert time_to(fast, 5.35) == (10.0, 20) and time_to(slow, 5.35) == (40.0, 20)
    assert time_to(fast, 4.0) is None
    assert target_loss({"fast": fast, "none": []}) is None  # one run alone is no comparison


def test_the_time_verdict_judges_the_train_commands_wall_clock_as_the_console_does():
    """The estimate projects the whole train command, start-up included (train/against_estimate.py):
    the card judges that figure, not the loop's own time, so card and console give one verdict."""
    from buildllm.report.card_data import CardData

    train = {"status": "completed", "elapsed_seconds": 100.0, "run_seconds": 112.0}
    estimate = {"estimated_seconds": 115.0, "estimated_seconds_low": 105.0, "estimated_seconds_high": 130.0}
    card = CardData("workspace", "workspace", {"train": train, "estimate": estimate}, {}, [], None)
    verdict = dict(headline(card))["run time against the estimate"]
    assert verdict == "1 min 52 s measured; estimate 1 min 55 s (range 1 min 45 s – 2 min 10 s): within the range"
    memory = {f"memory_estimate_{k}_bytes": v * 2**20 for k, v in (("total", 100), ("low", 85), ("high", 125))}
    card.records["dry_run"] = memory
    assert dict(headline(card))["memory estimate (dry run)"] == "100.0 MiB (range 85.0 MiB – 125.0 MiB)"
    # A run recorded before run_seconds existed is judged on its loop's time, as before.
    older = CardData(
        "workspace", "workspace", {"train": {**train, "run_seconds": None}, "estimate": estimate}, {}, [], None
    )
    assert "below the range" in dict(headline(older))["run time against the estimate"]
