"""docs/measured.md, generated from the measurement files committed under benchmarks/.

A figure typed by hand into a document drifts from the files it came from (issue 21: the README
named a "2-core AMD EPYC" beside a committed benchmark taken on an Intel Xeon). So measured runs
are kept as files, one folder per machine and one per run:

    benchmarks/<machine-id>/machine.json            the `machine` stage's fingerprint
    benchmarks/<machine-id>/<run>/benchmark.json    the stages' full records, as they wrote them
    benchmarks/<machine-id>/<run>/estimate.json     (dry_run.json, train.json when those ran)
    benchmarks/<machine-id>/<run>/run.json          date, command, and a note (a loaded machine, say)

and the document's tables are generated from them, whole:

    python -m buildllm.report.measured save NAME --note "..."   # this workspace's metrics/ -> benchmarks/
    python -m buildllm.report.measured                           # benchmarks/ -> docs/measured.md
    python -m buildllm.report.measured --check                   # exits non-zero when they disagree
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
from pathlib import Path

from buildllm.atomic import atomic_write_text
from buildllm.disk import as_user_error
from buildllm.errors import UserError, guarded
from buildllm.metrics import read_metrics
from buildllm.report.document import Bullets, Heading, Paragraph, Table, to_markdown
from buildllm.units import duration, size

BENCHMARKS = Path("benchmarks")
DOCUMENT = Path("docs") / "measured.md"
STAGES = ("dry_run", "benchmark", "estimate", "train")  # the records a run folder may hold
ISA = (("avx2", "AVX2"), ("avx512", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx", "AMX"))
NOT_RECORDED = "—"


def save(
    name: str,
    note: str,
    command: str,
    metrics: Path = Path("metrics"),
    root: Path = BENCHMARKS,
    today: str | None = None,
) -> Path:
    machine = read_metrics(metrics / "machine.json")
    benchmark = read_metrics(metrics / "benchmark.json")
    if benchmark.get("machine_id") != machine["machine_id"]:
        raise UserError(
            f"{metrics / 'benchmark.json'} was measured on machine {benchmark.get('machine_id')}, but "
            f"{metrics / 'machine.json'} is {machine['machine_id']}: rerun `dvc repro` here first"
        )
    if not name or any(c in name for c in "/\\ ") or name in (".", ".."):
        raise UserError(f"run name {name!r} must be one folder name without spaces, such as iteration1-defaults")
    folder = root / machine["machine_id"] / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(metrics / "machine.json", folder.parent / "machine.json")
    for stage in STAGES:
        source = metrics / f"{stage}.json"
        if source.exists():
            shutil.copyfile(source, folder / source.name)
        else:  # a record this run did not write must not stay from an earlier run of that name
            (folder / source.name).unlink(missing_ok=True)
    run = {"date": today or datetime.date.today().isoformat(), "command": command, "note": note}
    atomic_write_text(folder / "run.json", json.dumps(run, indent=2) + "\n")
    return folder


def _number(value, fmt: str) -> str:
    return NOT_RECORDED if isinstance(value, bool) or not isinstance(value, (int, float)) else fmt.format(value)


def _machine_line(m: dict) -> str:
    isa = ", ".join(label for key, label in ISA if m.get(key)) or "none of AVX2/AVX-512/AMX"
    gpus = "; ".join(
        f"{m[f'gpu{i}_name']} ({m[f'gpu{i}_memory_gib']} GiB, compute capability {m[f'gpu{i}_compute_capability']})"
        for i in range(m.get("gpu_count", 0))
    )
    return (
        f"{m['logical_cores']} logical cores ({m['physical_cores']} physical, {m.get('affinity_cores', '?')} "
        f"usable), {m['memory_total_gib']} GiB memory, {isa}; PyTorch {m['torch_version']}, CUDA "
        f"{m['cuda_version']}"
        + (f", driver {m['driver_version']}; GPU: {gpus}" if gpus else "; no GPU")
        + f"; `device: auto` resolves to {m['auto_device']}."
    )


def _row(name: str, run: dict, r: dict) -> list:
    b, e, t, d = (r.get(stage, {}) for stage in ("benchmark", "estimate", "train", "dry_run"))
    estimate_bytes = b.get("memory_estimate_total_bytes", d.get("memory_estimate_total_bytes"))
    peak = NOT_RECORDED if "peak_memory_bytes" not in b else size(b["peak_memory_bytes"])
    if isinstance(estimate_bytes, (int, float)):
        peak += f" (estimate {size(estimate_bytes)})"
    planned = NOT_RECORDED
    if "estimated_seconds" in e:
        low, high = duration(e["estimated_seconds_low"]), duration(e["estimated_seconds_high"])
        planned = f"{duration(e['estimated_seconds'])} ({low}–{high})"
    trained = NOT_RECORDED
    if "elapsed_seconds" in t:
        trained = f"{duration(t['elapsed_seconds'])} at {_number(t.get('tokens_per_second'), '{:,.0f}')} tokens/s"
    load = NOT_RECORDED
    if "other_load_start" in b:
        busy = " **busy**" if b.get("busy_machine") else ""
        load = f"{b['other_load_start']:.2f} / {b['other_load_end']:.2f} cores{busy}"
    first = b or e or t or d
    return [
        name,
        run.get("date", NOT_RECORDED),
        str(first.get("profile", NOT_RECORDED)),
        f"{first.get('device', NOT_RECORDED)} {first.get('precision', '')}".strip(),
        _number(first.get("batch_size"), "{}"),
        _number(first.get("threads"), "{}"),
        _number(b.get("tokens_per_second"), "{:,.0f}"),
        _number(b.get("mfu"), "{:.1%}"),
        _number(b.get("throughput_cv"), "{:.1%}"),
        peak,
        planned,
        trained,
        _number(t.get("final_validation_loss"), "{:.3f}"),
        load,
    ]


HEADER = (
    "run | date | profile | device | batch | threads | tokens/s | MFU | interval CV | peak memory | "
    "estimated run (range) | trained | final val. loss | others' CPU load (start / end)"
).split(" | ")


def render(root: Path = BENCHMARKS) -> str:
    """The whole document, from the files under `root` alone (sorted: the same files, the same text)."""
    blocks = [
        Heading(1, "Measured figures"),
        Paragraph(
            f"Generated by `python -m buildllm.report.measured` from the files under `{root.as_posix()}/`; "
            "do not edit it by hand (`tests/report/test_measured.py` fails when this file and those files "
            "disagree). Each machine is named by its `machine_id` (`buildllm/device/machine.py`); each run "
            "folder holds the stages' own metrics records. A run marked **busy** was measured while other "
            "processes took the cores it ran on (`buildllm/device/load.py`): its speed is lower than the "
            "machine's."
        ),
    ]
    machines = sorted(p for p in root.iterdir() if (p / "machine.json").exists()) if root.is_dir() else []
    if not machines:
        blocks.append(Paragraph("No measured runs are committed yet."))
    for folder in machines:
        machine = read_metrics(folder / "machine.json", with_notes=True)
        rows, notes = [], []
        for run_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
            run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
            records = {s: read_metrics(run_dir / f"{s}.json") for s in STAGES if (run_dir / f"{s}.json").exists()}
            rows.append(_row(run_dir.name, run, records))
            told = ([f"`{run['command']}`"] if run.get("command") else []) + ([run["note"]] if run.get("note") else [])
            if told:
                notes.append(f"**{run_dir.name}**: " + "; ".join(told))
        blocks += [
            Heading(2, f"{machine['cpu_model']} (`{folder.name}`)"),
            Paragraph(_machine_line(machine)),
            Table(HEADER, rows, "runs"),
            Bullets(notes),
        ]
    return to_markdown(blocks).rstrip("\n") + "\n"


def check(root: Path = BENCHMARKS, document: Path = DOCUMENT) -> None:
    if not document.exists() or document.read_text() != render(root):
        raise UserError(
            f"{document} does not match the files under {root}/: regenerate it with "
            "`python -m buildllm.report.measured` and commit both"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m buildllm.report.measured", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit non-zero when docs/measured.md disagrees with benchmarks/"
    )
    sub = parser.add_subparsers(dest="action")
    p = sub.add_parser("save", help="copy this workspace's metrics/ into benchmarks/<machine-id>/NAME/")
    p.add_argument("name")
    p.add_argument("--note", default="", help="what a reader must know: a loaded machine, a bounded run")
    p.add_argument("--command", default="dvc repro", help="the command that produced the metrics")
    args = parser.parse_args(argv)

    def work():
        if args.action == "save":
            print(f"saved {save(args.name, args.note, args.command)}; now run `python -m buildllm.report.measured`")
        elif args.check:
            check()
            print(f"{DOCUMENT} matches {BENCHMARKS}/")
        else:
            atomic_write_text(DOCUMENT, render())
            print(f"wrote {DOCUMENT}")

    return guarded(work, as_user_error)


if __name__ == "__main__":
    sys.exit(main())
