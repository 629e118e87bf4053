"""Which recipe learns the same in less time? Recipes trained against the clock on the same data.

Each round trains every recipe once, in a fresh `buildllm train` process each, the order rotating
from round to round (A B, B A, ...), so a machine that slows down or speeds up during the measurement
weighs on every recipe alike. Every run writes its log; the time to quality is the product's
(buildllm/report/curves.py, as `buildllm compare` reports it): the elapsed training seconds at the
first validation at or below a target in bits per byte, the target being the highest of all runs'
best (every run reaches it) unless --target names one. Per recipe: the median time and its interval
over the rounds, and, paired by round, its time over the reference's (the first recipe).

    python -m lab.recipes run --rounds 3                  # classic against muon, at iteration 1
    python -m lab.recipes run --recipe tiny-classic "preset=tiny train.recipe=classic" ...
    python -m lab.recipes render                          # benchmarks/recipes/*.json -> docs/recipes.md

A run's file keeps the machine (model, bf16/AMX flags), the load average before and after, every
command and every run's validation curve: docs/recipes.md is generated from those files alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from buildllm.atomic import atomic_write_text
from buildllm.errors import UserError, guarded
from buildllm.knob import set_dotted
from buildllm.measure.stats import sign_interval
from buildllm.report.curves import BITS, target_loss, time_to

RESULTS = Path("benchmarks") / "recipes"
DOCUMENT = Path("docs") / "recipes.md"
# The course's baseline first: the reference every other recipe's time is divided by.
DEFAULT_RECIPES = {"classic": "train.recipe=classic", "muon": "train.recipe=muon"}
# Every run alike: fp32 (a precision the tune stage may flip between runs is not the recipe's doing),
# a validation every 25 steps (the time to a target is resolved to it), no checkpoint until the end;
# threads: --threads (2 by default: the machine's two cores).
COMMON = {"precision": "fp32", "train.eval_interval": 25, "train.checkpoint_interval": 0}


def parse_settings(text: str) -> dict:
    """'key=value key=value' (YAML values) -> {dotted key: value}."""
    settings = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"recipe setting {item!r} is not key=value; write e.g. train.recipe=muon")
        settings[key] = yaml.safe_load(value)
    return settings


def machine() -> dict:
    from buildllm.device.machine import fingerprint, machine_id

    found = fingerprint()
    keys = "cpu_model cpu_kind logical_cores avx512 avx512_bf16 amx amx_bf16 torch_version gpu0_name".split()
    return {"machine_id": machine_id(found), **{k: found[k] for k in keys if k in found}}


def without(argv: list[str], *flags: str) -> list[str]:
    return [a for i, a in enumerate(argv) if a not in flags and (i == 0 or argv[i - 1] not in flags)]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def train_once(params: dict, settings: dict, data: dict, folder: Path, common: dict) -> dict:
    """One fresh `buildllm train` in `folder` (its metrics land there): its log and final figures."""
    chosen = json.loads(json.dumps(params))  # a deep copy of the project's params
    for key, value in {**common, **data, **settings, "train.checkpoint_directory": str(folder / "checkpoints")}.items():
        set_dotted(chosen, key, value)
    (folder / "params.yaml").write_text(yaml.safe_dump(chosen, sort_keys=False))
    command = [sys.executable, "-m", "buildllm", "train", "--params", "params.yaml"]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"a run of {settings} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    log = json.loads((folder / "metrics" / "train_log.json").read_text())
    final = json.loads((folder / "metrics" / "train.json").read_text())
    keep = (
        "train_seconds",
        "final_validation_bits_per_byte",
        "optimizer_steps",
        "tokens_per_second",
        "precision",
        "device",
        "batch_size",
    )
    return {
        "curve": [{k: r[k] for k in ("step", "elapsed_seconds", BITS)} for r in log if r.get(BITS) is not None],
        **{k: final[k] for k in keep if k in final},
        "other_load_mean": final.get("other_load_mean"),
    }


def save(record: dict, folder: Path, name: str) -> Path:
    """One comparison's record as `folder/name.json`, written whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def run(
    recipes: dict,
    rounds: int,
    params_path: Path,
    name: str,
    target: float | None = None,
    note: str = "",
    threads: int = 2,
    out: Path = RESULTS,
    vary_seed: bool = False,
) -> Path:
    if rounds < 1:
        raise UserError(f"--rounds {rounds}: a comparison needs at least one run of each recipe; give 1 or more")
    if vary_seed and (setting := next((n for n, s in recipes.items() if "seed" in s), None)):
        raise UserError(
            f"recipe {setting!r} sets its own seed and --vary-seed sets each round's: the runs of a round would not "
            "start alike; drop one of the two"
        )
    # threads 0: the params' own (on a GPU machine the CPU's thread count is not what is compared).
    common = {**COMMON, **({"train.threads": threads} if threads else {})}
    source = params_path if params_path.exists() else None  # none: every knob at its default
    params = yaml.safe_load(source.read_text()) if source else {}
    project = Path.cwd()
    # The pipeline's data, named absolutely: every run reads the same files from its own folder.
    from buildllm.config import load_config, profile_for
    from buildllm.paths import token_paths, tokenizer_path

    data = {}
    for settings in recipes.values():
        config = load_config(source, settings)
        vocab = profile_for(config).model.vocab_size
        train_path, validation_path = token_paths(config, vocab)
        if not train_path.exists():
            raise UserError(f"{train_path} does not exist: run `dvc repro tokenize` (with the recipe's settings) first")
        data[json.dumps(settings)] = {
            "train.train_tokens": str(project / train_path),
            "train.validation_tokens": str(project / validation_path),
            "train.tokenizer": str(project / tokenizer_path(config, vocab)),
        }
    record = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "load_average_before": load_average(),
        "common": common,
        "recipes": {k: " ".join(f"{a}={b}" for a, b in v.items()) for k, v in recipes.items()},
        # The note (prose, often long) is in the file already, and where it was first written says
        # nothing (the GPU check's scratch folder): the command says what was measured.
        "command": "python -m lab.recipes run " + shlex.join(without(sys.argv[2:], "--note", "--out")),
        "runs": [],
        **({"target": target} if target is not None else {}),
        **({"note": note} if note else {}),
    }
    names = list(recipes)
    first_seed = load_config(source, {}).seed
    with tempfile.TemporaryDirectory(prefix="buildllm-recipes-") as scratch:
        for round_ in range(rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for recipe in order:
                folder = Path(scratch) / f"{recipe}-{round_}"
                folder.mkdir()
                started = time.time()
                settings = recipes[recipe]
                # One seed per round, the same for every recipe in it: the ratio stays paired, and
                # the rounds' spread holds the learning's own (initial weights, batch order), which
                # repeating one seed leaves out.
                seed = {"seed": first_seed + round_} if vary_seed else {}
                result = train_once(params, settings, data[json.dumps(settings)], folder, {**common, **seed})
                record["runs"].append({"recipe": recipe, "round": round_, **seed, **result})
                record["load_average_after"] = load_average()
                # Written after every run: a measurement cut short keeps the rounds it finished.
                path = save(record, out, name)
                print(
                    f"round {round_ + 1}/{rounds} {recipe}: final {result['final_validation_bits_per_byte']:.3f} "
                    f"bits/byte, {result['train_seconds']:.1f} s training ({time.time() - started:.0f} s in all)",
                    flush=True,
                )
    print(summary_text(record))
    return path


def summarise(record: dict, target: float | None = None) -> dict:
    """Per recipe: its times to the common target (None where a run never reached it), the median and
    interval, and its paired time ratio to the reference (the first recipe)."""
    runs = record["runs"]
    curves = {f"{r['recipe']}-{r['round']}": r["curve"] for r in runs}
    target = target if target is not None else record.get("target") or target_loss(curves, BITS)
    names = list(record["recipes"])
    seconds, steps = {n: {} for n in names}, {n: [] for n in names}
    for r in runs:
        reached = time_to(r["curve"], target, BITS)
        seconds[r["recipe"]][r["round"]] = reached[0] if reached else None
        if reached:  # the step, unlike the time, does not depend on how loaded the machine was
            steps[r["recipe"]].append(reached[1])
    out = {"target": target, "recipes": {}}
    reference = seconds[names[0]]
    for n in names:
        times = [t for t in seconds[n].values() if t is not None]
        finals = [r["final_validation_bits_per_byte"] for r in runs if r["recipe"] == n]
        if not finals:  # a measurement cut short before this recipe's first run
            continue
        ratios = [
            t / reference[k] for k, t in seconds[n].items() if t is not None and reference.get(k) not in (None, 0)
        ]
        entry = {"runs": len(seconds[n]), "reached": len(times), "final_bits_per_byte": statistics.median(finals)}
        if steps[n]:
            entry["median_steps"] = statistics.median(steps[n])
        if times:
            low, high, coverage = sign_interval(times)
            entry |= {"median_seconds": statistics.median(times), "low": low, "high": high, "coverage": coverage}
        if ratios and n != names[0]:
            low, high, coverage = sign_interval(ratios)
            entry |= {
                "ratio": statistics.median(ratios),
                "ratio_low": low,
                "ratio_high": high,
                "ratio_coverage": coverage,
            }
        out["recipes"][n] = entry
    return out


def interval(low: float, high: float, coverage: float, unit: str) -> str:
    """The sign-test interval as text; one value has none."""
    if coverage == 0:
        return "one run: no interval"
    return f"{low:.2f}–{high:.2f}{unit}, {coverage:.0%} interval"


def summary_rows(record: dict) -> tuple[float, list]:
    s = summarise(record)
    rows = []
    for n, e in s["recipes"].items():
        time_cell = (
            f"{e['median_seconds']:.1f} s ({interval(e['low'], e['high'], e['coverage'], ' s')})"
            if "median_seconds" in e
            else "not reached"
        )
        ratio = (
            f"{e['ratio']:.2f}× ({interval(e['ratio_low'], e['ratio_high'], e['ratio_coverage'], '×')})"
            if "ratio" in e
            else ("reference" if n == next(iter(s["recipes"])) else "—")
        )
        rows.append(
            [
                n,
                f"`{record['recipes'][n]}`",
                f"{e['reached']}/{e['runs']}",
                f"{e['median_steps']:.0f}" if "median_steps" in e else "—",
                time_cell,
                ratio,
                f"{e['final_bits_per_byte']:.3f}",
            ]
        )
    return s["target"], rows


HEADER = [
    "recipe",
    "settings",
    "reached",
    "step reaching it (median)",
    "time to target: median (interval)",
    "time / reference's (paired)",
    "final bits/byte (median)",
]


def summary_text(record: dict) -> str:
    target, rows = summary_rows(record)
    lines = [f"time to {target:.3f} validation bits per byte (every recipe's runs reach it):"]
    lines += ["  " + " | ".join(map(str, row)) for row in [HEADER] + rows]
    return "\n".join(lines)


INTRO = (
    "Generated by `python -m lab.recipes render` from the files under `benchmarks/recipes/`; do not edit it "
    "by hand (`tests/lab/test_recipes.py` fails when the two disagree). A recipe is how a model learns: "
    "its optimizer, the learning-rate schedule and the peak rates (`train.recipe`, `buildllm/plan/recipe.py`; "
    "each profile's recipes are in `buildllm/profiles/*.yaml`). **classic** is GPT-2 with AdamW and a cosine "
    "schedule, the course's baseline, one flag away: `buildllm train --recipe classic` (or "
    "`dvc exp run -S train.recipe=classic`). **muon** trains the hidden 2-D weights with Muon "
    "(`torch.optim.Muon`, AdamW-matched scale) and embeddings, head, norms and biases with fused AdamW, on "
    "a warm-up, stable, decay (wsd) schedule."
)
METHOD = (
    "The measure is the time to a quality: each recipe trains in a fresh `buildllm train` process on the "
    "same data, the recipes taking turns round by round (the order rotating), and a run's time to the "
    "target is the elapsed training seconds (validations included, start-up not) at its first validation "
    "at or below the target, as `buildllm compare` reports it; validations come every 25 steps, in fp32, "
    "for every recipe (threads: the file's `common`). The target is the highest of all runs' best "
    "validation bits per byte, rounded up to 0.01, unless the file names one. Intervals: the sign-test "
    "interval of the median over the rounds (with 3 rounds, min to max, 75% coverage); the ratio is paired "
    "by round: a recipe's time over the reference's in the same round. The step at which a run reaches the "
    "target does not depend on how loaded the machine was; its time does. Every run starts from the params' "
    "seed unless the command says `--vary-seed`: then round r runs every recipe from seed + r, and the "
    "intervals hold the spread of the learning itself (the initial weights, the order of the batches), not "
    "only the machine's."
)


TRY = (
    "To rerun the comparison that chose the default (on a quiet machine: 2 threads), from the project's root "
    "after `dvc repro tokenize`: `python -m lab.recipes run --rounds 3`, then `python -m lab.recipes render`. "
    'Another recipe is a set of params: `--recipe NAME "key=value ..."`, repeated, the first the reference; '
    'e.g. `--recipe classic "train.recipe=classic" --recipe muon-cosine "train.recipe=muon '
    "train.schedule=cosine\"`. A file's settings name the recipe as the profiles held it on the file's date "
    "(its note says where a recipe's values have changed since), and the model as it was then: until "
    "2026-12-07 classic's `gelu` was GPT-2's tanh form (now `model.activation=gelu_tanh`), since then the exact "
    "GELU; the files named `*-exact-gelu-*` ran both forms beside muon (the same steps to the target; the "
    "exact form 0.93× the tanh form's time at iteration 1, 0.95× at tiny). The files named `explore-*` tried "
    "one change at a time on top of muon (AdamW's rate, Muon's rate, the decay share, ReLU squared, QK-norm, "
    "zero-initialised projections, a tied head), with fewer rounds or one thread; what they found shortened the "
    "time was AdamW's rate for embeddings, head, norms and biases (1e-2 instead of 3e-3: every profile's muon "
    "recipe now, iteration 1's since explore-iteration1-adamw1e-2), and ReLU squared, which kept the steps and "
    "made each cheaper there; it changes the model, and measured in 3 interleaved rounds on a CPU without "
    "AVX-512 (the files named `relu2-*`) it was later to the target at iteration 1, the default's profile "
    "(0.35× classic's time against muon's 0.30×) and no sooner on student (1.02× muon's time, "
    "explore-relu2-student-zen1-2026-12-06); on a Zen 3 its steps were cheaper and it was still later (1.12× "
    "muon's time, explore-relu2-iteration1-zen3-2026-12-07), so it stays a knob (`model.activation=relu2`) and "
    "the classic recipe stays GPT-2. Nor did a higher Muon rate (1e-2), a higher AdamW rate (2e-2), a 5-step "
    "warm-up or a batch of 8 reach the target sooner at iteration 1 (explore-muon-rates-iteration1-zen3-2026-12-07, "
    "explore-muon-batch-warmup-iteration1-zen3-2026-12-07, the latter from a seed per round: `--vary-seed`). "
    "Preset small (10.5M parameters) takes muon too, since small-zen3-2026-12-07: it reached classic's final "
    "bits per byte at step 275 against classic's 600, but in 0.69× classic's time, not about 0.3×: a Muon "
    "step there took 1.6× classic's, its Newton-Schulz iterations on the 384-wide matrices being "
    "large beside a batch of 8 on a CPU without bf16 (fp32 there; bf16 on a GPU or a bf16 CPU, not measured for "
    "small). A batch of 16 halves the orthogonalisations per token: one run of it reached the target in "
    "about 0.57× classic's time (explore-muon-b16-small-zen3-2026-12-07), not yet a paired comparison, so "
    "small's batch stays 8. "
    "On a GPU the comparison is a step of the lent GPU check "
    "(`scripts/gpu_check.sh`, docs/gpu.md): iteration 1 at the GPU route's own batch (`recipes-it1`) and at the "
    "CPU comparisons' batch of 16 (`recipes-it1-b16`), brought into this folder by `python scripts/gpu_home.py "
    "OUT --record`. Until such a file is here the GPU is not measured this way: iteration 1 takes muon there "
    "too, unmeasured, so that its CPU and GPU runs learn by one recipe."
)


def render(root: Path = RESULTS) -> str:
    from buildllm.report.document import Bullets, Heading, Paragraph, Table, to_markdown

    blocks = [Heading(1, "Recipes: time to a quality"), Paragraph(INTRO), Paragraph(METHOD), Paragraph(TRY)]
    files = sorted(root.glob("*.json")) if root.is_dir() else []
    if not files:
        blocks.append(Paragraph("No comparison is committed yet."))
    for path in files:
        record = json.loads(path.read_text())
        m = record["machine"]
        flags = ", ".join(k for k in ("avx512", "avx512_bf16", "amx", "amx_bf16") if m.get(k)) or "none of AVX-512/AMX"
        target, rows = summary_rows(record)
        loads = [r.get("other_load_mean") for r in record["runs"] if r.get("other_load_mean") is not None]
        gpu = f"{m['gpu0_name']}, on " if m.get("gpu0_name") else ""
        kind = f" ({m['cpu_kind']})" if m.get("cpu_kind") else ""  # absent from records before 2026-12-07
        blocks += [
            Heading(2, f"{path.stem} ({record['date']})"),
            Paragraph(
                f"{gpu}{m['cpu_model']}{kind} (`{m['machine_id']}`), {m['logical_cores']} cores, flags: {flags}; torch "
                f"{m['torch_version']}. Load average before {record['load_average_before']}, after "
                f"{record['load_average_after']}; other processes took {statistics.median(loads):.2f} cores on "
                f"median during the runs ({len(record['runs'])} runs)."
                if loads
                else ""
            ),
            Paragraph(f"Target: **{target:.3f}** validation bits per byte. Command: `{record['command']}`."),
            Table(HEADER, rows, path.stem),
            Bullets([note] if (note := record.get("note")) else []),
        ]
    return to_markdown(blocks).rstrip("\n") + "\n"


def check(root: Path = RESULTS, document: Path = DOCUMENT) -> None:
    if not document.exists() or document.read_text() != render(root):
        raise UserError(f"{document} does not match {root}/: regenerate it with `python -m lab.recipes render`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.recipes", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("run", help="train the recipes in turns and write benchmarks/recipes/NAME.json")
    p.add_argument(
        "--recipe",
        nargs=2,
        action="append",
        metavar=("NAME", "SETTINGS"),
        help="a recipe as 'key=value ...' over params.yaml (repeatable; the first is the reference); "
        "default: classic and muon",
    )
    p.add_argument("--rounds", type=int, default=3, help="runs of each recipe, taking turns")
    p.add_argument("--name", default=None, help="the results file's name; default: <machine id>-<date>")
    p.add_argument("--target", type=float, default=None, help="bits per byte; default: the highest best of all runs")
    p.add_argument("--note", default="", help="what a reader must know (a loaded machine, shorter runs)")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument(
        "--threads", type=int, default=2, help="torch threads of every run (a loaded machine: 1; 0: the params' own)"
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="the results file's folder (default %(default)s)")
    p.add_argument(
        "--vary-seed",
        action="store_true",
        help="round r trains every recipe from seed + r (default: every run from the params' seed, so the "
        "rounds differ in timing only)",
    )
    sub.add_parser("render", help="benchmarks/recipes/*.json -> docs/recipes.md")
    sub.add_parser("check", help="exit non-zero when docs/recipes.md disagrees with benchmarks/recipes/")
    args = parser.parse_args(argv)

    def work():
        if args.action == "run":
            recipes = {n: parse_settings(s) for n, s in (args.recipe or DEFAULT_RECIPES.items())}
            name = args.name or f"{machine()['machine_id']}-{datetime.date.today().isoformat()}"
            path = run(
                recipes, args.rounds, args.params, name, args.target, args.note, args.threads, args.out, args.vary_seed
            )
            print(f"wrote {path}; now `python -m lab.recipes render`")
        elif args.action == "render":
            atomic_write_text(DOCUMENT, render())
            print(f"wrote {DOCUMENT}")
        else:
            check()
            print(f"{DOCUMENT} matches {RESULTS}/")

    return guarded(work)


if __name__ == "__main__":
    sys.exit(main())
