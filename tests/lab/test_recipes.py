"""lab/recipes.py: recipes trained in turns by real `buildllm train` processes, their time to a common
target in bits per byte (the compare report's own rule), and docs/recipes.md generated from the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_fixtures import make_token_files

from lab import recipes

ROOT = Path(__file__).resolve().parents[2]


def curve(*points):
    return [{"step": s, "elapsed_seconds": t, "validation_bits_per_byte": b} for s, t, b in points]


def run_of(recipe: str, round_: int, *points) -> dict:
    final = points[-1][2]
    return {"recipe": recipe, "round": round_, "curve": curve(*points), "final_validation_bits_per_byte": final}


def record(runs: list) -> dict:
    return {"recipes": {"classic": "train.recipe=classic", "muon": "train.recipe=muon"}, "runs": runs}


def test_time_to_the_common_target_is_paired_by_round():
    runs = [
        run_of("classic", 0, (0, 0, 3.5), (25, 10, 2.6), (50, 20, 2.395)),
        run_of("muon", 0, (0, 0, 3.5), (25, 12, 2.38), (50, 24, 2.2)),
        run_of("classic", 1, (0, 0, 3.5), (25, 11, 2.7), (50, 22, 2.39)),
        run_of("muon", 1, (0, 0, 3.5), (25, 11, 2.5), (50, 22, 2.3)),
    ]
    summary = recipes.summarise(record(runs))
    assert summary["target"] == 2.40  # the highest best of all runs, rounded up to 0.01: every run reaches it
    muon, classic = summary["recipes"]["muon"], summary["recipes"]["classic"]
    assert classic["median_seconds"] == 21 and classic["reached"] == 2
    assert muon["median_seconds"] == 17  # round 0 at 12 s, round 1 at 22 s
    assert (muon["median_steps"], classic["median_steps"]) == (37.5, 50)
    assert muon["ratio"] == pytest.approx((12 / 20 + 22 / 22) / 2)  # each round against its own reference
    assert (muon["ratio_low"], muon["ratio_high"]) == (pytest.approx(0.6), pytest.approx(1.0))
    assert "ratio" not in classic
    # A named target the runs never reach is said, not hidden.
    summary = recipes.summarise(record(runs), target=2.25)
    assert summary["recipes"]["classic"]["reached"] == 0 and summary["recipes"]["muon"]["reached"] == 1


def test_a_setting_that_is_not_key_value_is_refused_in_one_line(capsys):
    assert recipes.main(["run", "--recipe", "broken", "train.recipe"]) == 2
    assert "is not key=value" in capsys.readouterr().err


def test_no_rounds_is_refused_in_one_line_and_writes_nothing(tmp_path, capsys):
    argv = ["run", "--rounds", "0", "--name", "none", "--out", str(tmp_path / "out")]
    assert recipes.main(argv) == 2
    assert "--rounds 0" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_recipe_with_its_own_seed_is_refused_beside_vary_seed(tmp_path, capsys):
    argv = ["run", "--vary-seed", "--out", str(tmp_path / "out"), "--recipe", "mine", "train.recipe=muon seed=7"]
    assert recipes.main(argv) == 2
    assert "sets its own seed" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_vary_seed_starts_each_round_from_its_own_seed(tmp_path, monkeypatch):
    paths = make_token_files(tmp_path / "tokens")
    monkeypatch.chdir(tmp_path)
    data = f"train.train_tokens={paths['train']} train.validation_tokens={paths['validation']} "
    data += f"train.tokenizer={paths['tokenizer']} preset=tiny device=cpu train.training_examples=160"
    argv = ["run", "--rounds", "2", "--threads", "1", "--name", "seeds", "--params", str(tmp_path / "none.yaml")]
    assert recipes.main([*argv, "--vary-seed", "--recipe", "muon", data]) == 0
    runs = json.loads((tmp_path / "benchmarks" / "recipes" / "seeds.json").read_text())["runs"]
    assert [r["seed"] for r in runs] == [1337, 1338]
    # Other initial weights: the untrained model's validation differs between the rounds.
    first = [r["curve"][0]["validation_bits_per_byte"] for r in runs]
    assert first[0] != first[1]


def test_the_committed_document_matches_the_committed_results(monkeypatch):
    monkeypatch.chdir(ROOT)
    recipes.check()


def test_a_saved_record_replaces_the_old_one_whole(tmp_path):
    folder = tmp_path / "new" / "recipes"
    first = recipes.save(record([run_of("classic", 0, (0, 0.0, 4.0))]), folder, "check")
    assert first == folder / "check.json" and json.loads(first.read_text())["runs"][0]["recipe"] == "classic"
    again = recipes.save(record([]), folder, "check")
    assert json.loads(again.read_text())["runs"] == [] and list(folder.iterdir()) == [again]


@pytest.mark.slow
def test_two_recipes_train_in_turns_and_the_document_shows_them(tmp_path, monkeypatch, capsys):
    paths = make_token_files(tmp_path / "tokens")
    monkeypatch.chdir(tmp_path)
    data = f"train.train_tokens={paths['train']} train.validation_tokens={paths['validation']} "
    data += f"train.tokenizer={paths['tokenizer']} preset=tiny device=cpu train.training_examples=320"
    argv = ["run", "--rounds", "1", "--threads", "1", "--name", "check", "--params", str(tmp_path / "none.yaml")]
    argv += ["--recipe", "classic", data, "--recipe", "muon", data + " train.optimizer=muon train.schedule=wsd"]
    assert recipes.main(argv) == 0
    saved = json.loads((tmp_path / "benchmarks" / "recipes" / "check.json").read_text())
    assert [(r["recipe"], r["round"]) for r in saved["runs"]] == [("classic", 0), ("muon", 0)]
    assert all(r["optimizer_steps"] == 10 and r["curve"][0]["step"] == 0 for r in saved["runs"])
    assert saved["common"]["train.threads"] == 1 and saved["machine"]["logical_cores"] >= 1
    out = capsys.readouterr().out
    assert "time to" in out and "muon" in out
    assert recipes.main(["render"]) == 0
    document = (tmp_path / "docs" / "recipes.md").read_text()
    assert "## check (" in document and "| muon |" in document
    assert list((tmp_path / "benchmarks" / "recipes").iterdir()) == [tmp_path / "benchmarks" / "recipes" / "check.json"]
