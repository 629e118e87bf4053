"""At home, after a GPU machine's runs came back: one command from the folder they came back in
(the GPU check's $OUT, or wherever a rented machine's runs.tar.gz was copied) to the CPU-vs-CUDA
report. Run it from the project's root, where the CPU runs are made:

    python scripts/gpu_home.py OUT [--report reports/cpu_vs_cuda]

1. `buildllm import-runs OUT/runs.tar.gz --force`: each run a DVC experiment here.
2. Runs that differ only in device and precision form a group; each group of iteration 1 gets its
   CPU twin here, `dvc exp run --temp -n cpu-... -S <the group's values> -S device=cpu -S precision=fp32
   <the same stages>`, unless an experiment of that name exists (iterations 2 and 3 would take
   hours on a CPU: they are imported, and `dvc exp show` lists them).
3. `buildllm compare <twin> <runs>` per group: REPORT_<group>.md, .csv, .png, .html.
4. With --record: every run and twin saved under benchmarks/<machine-id>/ (`python -m
   buildllm.report.measured save NAME --experiment NAME`, each run with its twin as reference), then
   docs/measured.md and the README's headline regenerated from them; commit them.

First, the recipe comparisons the check ran (their records ride in OUT/results.jsonl): each one's
time to a quality shown, and with --record filed under benchmarks/recipes/ and docs/recipes.md
regenerated (`python -m lab.recipes render`). A folder with those and no runs.tar.gz ends there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from buildllm.atomic import atomic_write_text  # noqa: E402
from buildllm.disk import as_user_error  # noqa: E402
from buildllm.errors import UserError, guarded  # noqa: E402
from buildllm.remote import archive  # noqa: E402
from buildllm.remote.import_runs import existing_experiments  # noqa: E402
from buildllm.report import measured, measured_save  # noqa: E402
from lab import recipes as lab_recipes  # noqa: E402

VARIABLE = ("device=", "precision=")


def groups(runs: list[archive.Run]) -> dict[str, list[archive.Run]]:
    found: dict[tuple, list] = {}
    for run in runs:
        controls = tuple(o for o in run.overrides if not o.startswith(VARIABLE))
        found.setdefault((controls, tuple(run.stages)), []).append(run)
    return {members[0].name: members for members in found.values()}


def twin(members: list[archive.Run]) -> tuple[str, list[str]] | None:
    """The CPU run of a group of iteration 1: its name and `-S` values."""
    first = members[0]
    if "iteration=1" not in first.overrides:
        return None
    fp32 = next((r for r in members if "precision=fp32" in r.overrides), first)
    name = "cpu-" + fp32.name.removeprefix("cuda-").replace("bf16", "fp32")
    values = [o for o in first.overrides if not o.startswith(VARIABLE)] + ["device=cpu", "precision=fp32"]
    return name, values


def call(command: list[str]) -> None:
    print("$ " + " ".join(command), flush=True)
    done = subprocess.run(command)
    if done.returncode != 0:
        raise UserError(f"`{' '.join(command[:5])} ...` failed (exit code {done.returncode}; its output is above)")


def record(run: archive.Run, reference: str | None) -> None:
    sets = " ".join(f"-S {o}" for o in run.overrides)
    command = f"buildllm pack-run {run.name} {sets} --stages {' '.join(run.stages)}"
    note = "measured on the GPU machine and brought home in a runs archive (`buildllm import-runs`)"
    print(f"saved {measured_save.save(run.name, note, command, experiment=run.name, reference=reference)}")


def recipes(folder: Path, keep: bool) -> int:
    results = folder / "results.jsonl"
    entries = map(json.loads, results.read_text().splitlines()) if results.exists() else []
    found = [e["figures"] for e in entries if "record" in e.get("figures", {})]
    for figures in found:
        print(f"{figures['name']}: {lab_recipes.summary_text(figures['record'])}")
        if keep:
            print(f"saved {lab_recipes.save(figures['record'], lab_recipes.RESULTS, figures['name'])}")
    if keep and found:
        atomic_write_text(lab_recipes.DOCUMENT, lab_recipes.render())
        print(f"wrote {lab_recipes.DOCUMENT}")
    return len(found)


def home(folder: str, report: str, keep: bool = False) -> None:
    path = Path(folder) / "runs.tar.gz" if Path(folder).is_dir() else Path(folder)
    if Path(folder).is_dir() and recipes(Path(folder), keep) and not path.exists():
        print(f"{path} is not there: no runs to import")
        return
    runs = archive.read(path)
    call([sys.executable, "-m", "buildllm", "import-runs", str(path), "--force"])
    for label, members in groups(runs).items():
        made = twin(members)
        if made is None:
            for run in members if keep else []:
                record(run, None)
            continue
        name, values = made
        stages = [s for s in members[0].stages if s != "machine"]
        command = [sys.executable, "-m", "dvc", "exp", "run", "--temp", "-n", name]
        command += [*(f for v in values for f in ("-S", v)), *stages]
        # The twin's speed is this machine's at this moment: its load goes into the record's note.
        note = f"the CPU twin of {', '.join(r.name for r in members)}, made here with their controls"
        note += "; load average {:.2f} / {:.2f} / {:.2f} (1 / 5 / 15 min) on {} cores as it started".format(
            *os.getloadavg(), os.cpu_count()
        )
        if name not in existing_experiments():
            call(command)
        else:
            note = f"the CPU twin of {', '.join(r.name for r in members)}, an experiment made here before"
        out = f"{report}_{label.removeprefix('cuda-')}"
        call([sys.executable, "-m", "buildllm", "compare", name, *(r.name for r in members), "--out", out])
        if keep:
            saved = measured_save.save(name, note, " ".join(command[2:]), experiment=name)
            print(f"saved {saved}")
            for run in members:
                record(run, f"{saved.parent.name}/{name}")
    if keep:
        measured.main([])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the folder the GPU check's files came back in, or a runs archive")
    parser.add_argument("--report", default="reports/cpu_vs_cuda", help="report path prefix (default %(default)s)")
    parser.add_argument(
        "--record", action="store_true", help="save the runs and twins under benchmarks/, regenerate docs/measured.md"
    )
    args = parser.parse_args()
    return guarded(lambda: home(args.folder, args.report, args.record), as_user_error)


if __name__ == "__main__":
    sys.exit(main())
