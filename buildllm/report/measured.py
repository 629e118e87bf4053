"""docs/measured.md, generated from the measurement files committed under benchmarks/.

A figure typed by hand into a document drifts from the files it came from (issue 21: the README
named a "2-core AMD EPYC" beside a committed benchmark taken on an Intel Xeon). So measured runs
are kept as files, one folder per machine and one per run:

    benchmarks/<machine-id>/machine.json            the `machine` stage's fingerprint
    benchmarks/<machine-id>/<run>/benchmark.json    the stages' full records, as they wrote them
    benchmarks/<machine-id>/<run>/estimate.json     (dry_run.json, train.json when those ran)
    benchmarks/<machine-id>/<run>/run.json          date, command, a note (a loaded machine, say), and
                                                    the reference run its speed-up is measured against

and the document's tables, and the README's headline of speed-ups, are generated from them, whole:

    python -m buildllm.report.measured save NAME --note "..."   # this workspace's metrics/ -> benchmarks/
    python -m buildllm.report.measured save NAME --experiment EXP --reference MACHINE-ID/RUN
    python -m buildllm.report.measured                           # -> docs/measured.md, README's headline
    python -m buildllm.report.measured --check                   # exits non-zero when they disagree
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from buildllm.atomic import atomic_write_text
from buildllm.disk import as_user_error
from buildllm.errors import UserError, guarded
from buildllm.measure.stats import NOISY_CV, from_intervals, is_noisy
from buildllm.metrics import read_metrics
from buildllm.report.document import Bullets, Heading, Paragraph, Table, to_markdown
from buildllm.report.measured_save import BENCHMARKS, STAGES, save
from buildllm.units import duration, size

DOCUMENT = Path("docs") / "measured.md"
README = Path("README.md")
ISA = (("avx2", "AVX2"), ("avx512", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx", "AMX"))
NOT_RECORDED = "—"


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
        + (f", driver {_driver(m)}; GPU: {gpus}" if gpus else "; no GPU")
        + f"; `device: auto` resolves to {m['auto_device']}."
    )


def _driver(m: dict) -> str:
    # machine.py before its fix read "for" from "Open Kernel Module for x86_64  580.159.04" as the version.
    return m["driver_version"] if re.match(r"\d", str(m.get("driver_version"))) else "not recorded"


def _row(name: str, run: dict, r: dict) -> list:
    b, e, t, d = (r.get(stage, {}) for stage in ("benchmark", "estimate", "train", "dry_run"))
    estimate_bytes = b.get("memory_estimate_total_bytes", d.get("memory_estimate_total_bytes"))
    peak = NOT_RECORDED if "peak_memory_bytes" not in b else size(b["peak_memory_bytes"])
    if isinstance(estimate_bytes, (int, float)):
        ratio = b.get("memory_estimate_ratio")
        peak += f" (estimate {size(estimate_bytes)}" + (f", ×{ratio:.3f})" if isinstance(ratio, float) else ")")
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
        f"{first.get('device', NOT_RECORDED)} {first.get('precision', '')}".strip()
        + (" compiled" if first.get("compile_enabled") else ""),
        _number(first.get("batch_size"), "{}"),
        _number(first.get("threads"), "{}"),
        _number(b.get("tokens_per_second"), "{:,.0f}"),
        _number(b.get("mfu"), "{:.1%}") + _peak_source(b),
        _number(b.get("throughput_cv"), "{:.1%}"),
        peak,
        planned,
        trained,
        _number(t.get("final_validation_loss"), "{:.3f}"),
        load,
    ]


def _peak_source(b: dict) -> str:
    return " of datasheet" if str(b.get("peak_flops_source", "")).startswith("datasheet") else ""


HEADER = (
    "run | date | profile | device | batch | threads | tokens/s | MFU | interval CV | peak memory (estimate, "
    "÷ peak) | "
    "estimated run (range) | trained | final val. loss | others' CPU load (start / end)"
).split(" | ")


def _load(root: Path) -> list:
    """[(machine id, machine record, [(run name, run.json, {stage: record})])], sorted."""
    machines = sorted(p for p in root.iterdir() if (p / "machine.json").exists()) if root.is_dir() else []
    loaded = []
    for folder in machines:
        runs = []
        for run_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
            run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
            records = {s: read_metrics(run_dir / f"{s}.json") for s in STAGES if (run_dir / f"{s}.json").exists()}
            runs.append((run_dir.name, run, records))
        loaded.append((folder.name, read_metrics(folder / "machine.json", with_notes=True), runs))
    return loaded


def _device_name(m: dict) -> str:
    return m["gpu0_name"] if m.get("gpu_count") and m.get("gpu0_name") else m["cpu_model"]


def speedups(machines: list) -> list:
    """Each run saved with a reference, against it: (run, machine, reference, its machine, records,
    reference records, Speedup); a speed-up's interval comes from both runs' measured intervals."""
    index = {f"{mid}/{name}": (machine, run, records) for mid, machine, runs in machines for name, run, records in runs}
    found = []
    for key, (machine, run, records) in index.items():
        if not run.get("reference"):
            continue
        if run["reference"] not in index:
            raise UserError(f"{key} names reference {run['reference']}, which is not under benchmarks/: save it first")
        ref_machine, _, ref_records = index[run["reference"]]
        ratio = from_intervals(ref_records.get("benchmark", {}), records.get("benchmark", {}))
        found.append((key, machine, run["reference"], ref_machine, records, ref_records, ratio))
    return found


def _ratio(s) -> str:
    if s is None:
        return NOT_RECORDED
    return f"{s.estimate:.2f}× ({s.low:.2f}–{s.high:.2f}×)" if s.has_interval else f"{s.estimate:.2f}× (no interval)"


def _doubt(records: dict, ref_records: dict) -> str:
    """Why a speed-up is not a result (compare's rule, buildllm/report/compare.py), or ""."""
    why = []
    for who, r in (("run", records.get("benchmark", {})), ("reference", ref_records.get("benchmark", {}))):
        if r.get("busy_machine"):
            why.append(f"{who} busy")
        elif is_noisy(r.get("throughput_cv")):
            why.append(f"{who}'s intervals varied over {NOISY_CV:.0%}")
    return ", ".join(why)


def _loss(records: dict) -> str:
    return _number(records.get("train", {}).get("final_validation_loss"), "{:.3f}")


def _speedup_rows(found: list) -> list:
    rows = []
    for key, machine, ref, ref_machine, records, ref_records, s in found:
        b, rb = records.get("benchmark", {}), ref_records.get("benchmark", {})
        rows.append(
            [
                key.split("/", 1)[1],
                _device_name(machine),
                ref.split("/", 1)[1],
                _device_name(ref_machine),
                _number(b.get("tokens_per_second"), "{:,.0f}"),
                _number(rb.get("tokens_per_second"), "{:,.0f}"),
                _ratio(s) + (f", inconclusive ({doubt})" if (doubt := _doubt(records, ref_records)) else ""),
                f"{_loss(records)} / {_loss(ref_records)}",
            ]
        )
    return rows


SPEEDUP_HEADER = (
    "run | on | against | on | tokens/s | against's tokens/s | speed-up (95% interval) | "
    "final val. loss (run / against)"
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
            "machine's. MFU is against a matmul peak measured in the run, or, marked, a datasheet's; the "
            "memory estimate's factor is estimate ÷ measured peak."
        ),
    ]
    machines = _load(root)
    if not machines:
        blocks.append(Paragraph("No measured runs are committed yet."))
    found = speedups(machines)
    if found:
        blocks += [
            Heading(2, "Speed-ups against a reference run"),
            Paragraph(
                "Each run saved with a reference (`run.json`), against that run: the ratio of tokens/s, its "
                "95% interval from the spread of both runs' measured intervals (Welch's t on log rates, "
                "`buildllm/measure/stats.py`). The interval sees noise within each run, not a reference "
                "machine that was slower for a whole run: a run measured on a busy machine, or whose "
                "intervals varied over the noise threshold, makes its ratio inconclusive, shown but not a "
                "result (as `buildllm compare` says; the runs' tables below give each run's load)."
            ),
            Table(SPEEDUP_HEADER, _speedup_rows(found), "speedups"),
        ]
    for machine_id, machine, runs in machines:
        rows, notes = [], []
        for name, run, records in runs:
            rows.append(_row(name, run, records))
            told = ([f"`{run['command']}`"] if run.get("command") else []) + ([run["note"]] if run.get("note") else [])
            if told:
                notes.append(f"**{name}**: " + "; ".join(told))
        blocks += [
            Heading(2, f"{_device_name(machine)} (`{machine_id}`)"),
            Paragraph(_machine_line(machine)),
            Table(HEADER, rows, "runs"),
            Bullets(notes),
        ]
    return to_markdown(blocks).rstrip("\n") + "\n"


# The README's headline: the same speed-ups, between these markers, written by the same command.
HEADLINE_START = "<!-- measured: written by `python -m buildllm.report.measured` from benchmarks/; do not edit -->"
HEADLINE_END = "<!-- /measured -->"


def headline(root: Path = BENCHMARKS) -> str:
    lines = [
        HEADLINE_START,
        "Measured so far, from the runs committed under `benchmarks/` (each figure's machine, load and "
        "interval: [docs/measured.md](docs/measured.md)):",
        "",
    ]
    for key, machine, ref, ref_machine, records, ref_records, s in speedups(_load(root)):
        b = records.get("benchmark", {})
        loss = _loss(records)
        lines.append(
            f"- `{key.split('/', 1)[1]}` on {_device_name(machine)}: "
            f"{_number(b.get('tokens_per_second'), '{:,.0f}')} tokens/s, MFU {_number(b.get('mfu'), '{:.1%}')}"
            f"{_peak_source(b)}; "
            # A ratio that is no result stays on the page, with why; the headline does not quote it.
            + ("the speed-up against" if (doubt := _doubt(records, ref_records)) else _ratio(s))
            + f" `{ref.split('/', 1)[1]}` on {_device_name(ref_machine)}"
            + (f" is inconclusive ({doubt})" if doubt else "")
            + (f"; final validation loss {loss} against {_loss(ref_records)}" if loss != NOT_RECORDED else "")
        )
    return "\n".join([*lines, HEADLINE_END])


def with_headline(readme: str, root: Path = BENCHMARKS) -> str:
    start, end = readme.find(HEADLINE_START), readme.find(HEADLINE_END)
    if start < 0 or end < start:
        raise UserError(f"{README} has no headline block ({HEADLINE_START} ... {HEADLINE_END}); put one back")
    return readme[:start] + headline(root) + readme[end + len(HEADLINE_END) :]


def check(root: Path = BENCHMARKS, document: Path = DOCUMENT, readme: Path = README) -> None:
    for path, made in ((document, render), (readme, lambda r: with_headline(readme.read_text(), r))):
        if not path.exists() or path.read_text() != made(root):
            raise UserError(
                f"{path} does not match the files under {root}/: regenerate it with "
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
    where = "a metrics folder, or one benchmark record (default: metrics/)"
    p.add_argument("--metrics", type=Path, default=Path("metrics"), help=where)
    p.add_argument("--experiment", help="save this DVC experiment's records instead (an imported run, say)")
    p.add_argument("--reference", help="MACHINE-ID/RUN under benchmarks/: the run its speed-up is measured against")
    args = parser.parse_args(argv)

    def work():
        if args.action == "save":
            folder = save(
                args.name, args.note, args.command, args.metrics, experiment=args.experiment, reference=args.reference
            )
            print(f"saved {folder}; now run `python -m buildllm.report.measured`")
        elif not (README.is_file() and DOCUMENT.parent.is_dir()):
            raise UserError(f"no {README} and {DOCUMENT.parent}/ here: run it from the project's root")
        elif args.check:
            check()
            print(f"{DOCUMENT} matches {BENCHMARKS}/")
        else:
            atomic_write_text(DOCUMENT, render())
            atomic_write_text(README, with_headline(README.read_text()))
            print(f"wrote {DOCUMENT} and {README}'s headline")

    return guarded(work, as_user_error)


if __name__ == "__main__":
    sys.exit(main())
