"""`buildllm compare`'s report: a Comparison written as <out>.md, <out>.csv, <out>.png,
<out>_curves.png and one self-contained <out>.html, every file atomically.

Every file leads with the verdict and the controls, as the course asks: a speed-up means nothing
until the controls are confirmed. The HTML inlines its charts and styles, so it opens the same with
no network, mailed or archived. The command lives here, not in compare.py (which builds), because
compare.py never imports the writer.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from buildllm.atomic import atomic_write, atomic_write_text
from buildllm.config import control_keys
from buildllm.errors import UserError
from buildllm.measure.stats import NOISY_CV, is_noisy
from buildllm.metrics import json_line
from buildllm.report.card_charts import NOT_RECORDED, duration, machine_line, missing, number, recorded, size, span
from buildllm.report.chart import write_chart
from buildllm.report.compare import Comparison, compare, tokenizer_note
from buildllm.report.curves import TARGET_NOTE, UNITS, time_to, write_curves
from buildllm.report.document import (
    Bullets,
    Code,
    Details,
    Heading,
    Image,
    Paragraph,
    Table,
    Verdict,
    to_html,
    to_markdown,
)

# The course's controls, always shown (the config knobs declared as controls, and what the plan
# resolved them to); other controls are listed only when they differ.
KEY_CONTROLS = control_keys() + (
    "profile",
    "architecture",
    "parameters",
    "sequence_length",
    "vocab_size",
    "batch_size",
    "measured_steps",
)


def cells(f: pd.DataFrame, show, *columns: str) -> list:
    """`show` applied across each experiment's values of `columns` (a column the frame lacks: None)."""
    return list(map(show, *(list(f[name]) if name in f else [None] * len(f) for name in columns)))


def speedup_cells(c: Comparison) -> list:
    """The speed-up of each experiment with its interval, and whether it is a result."""
    if not c.speedups_shown:
        return ["withheld"] * len(c.experiments)
    cells = ["1.00× (reference)" if c.speedups else NOT_RECORDED]
    for exp in c.experiments[1:]:
        s = c.speedups.get(exp.name)
        if s is None:
            cells.append(NOT_RECORDED)
        else:
            interval = f"{s.level} interval {s.low:.2f}–{s.high:.2f}×" if s.has_interval else "no interval"
            cells.append(f"{s.estimate:.2f}× ({interval}; {'inconclusive' if c.inconclusive(exp.name) else 'result'})")
    return cells


@recorded
def _noise(cv) -> str:
    return f"{cv:.1%}" + (f" (noisy: over {NOISY_CV:.0%})" if is_noisy(cv) else "")


def _load(start, end, busy) -> str:
    if missing(start) or missing(end):
        return NOT_RECORDED
    flag = " (busy machine: figures slowed)" if not missing(busy) and bool(busy) else ""
    return f"{start:.2f} / {end:.2f} cores{flag}"


def _rate_range(low, high, steps, tokens) -> str:
    if any(missing(v) for v in (low, high, steps, tokens)) or not steps:
        return NOT_RECORDED
    per_step = tokens / steps
    return f"{low * per_step:,.0f} – {high * per_step:,.0f}"


def _peak(flops, source) -> str:
    if missing(flops):
        return NOT_RECORDED
    return f"{flops / 1e12:.3g} TFLOP/s ({source if not missing(source) and source else 'source not recorded'})"


def results_rows(c: Comparison) -> list:
    f, whole = c.frame, number("{:,.0f}")
    paired = []
    if c.paired is not None:
        paired = [
            (
                f"tokens/s, paired re-runs (median of {len(c.paired.rounds)})",
                cells(f, whole, "paired_tokens_per_second"),
            ),
            ("throughput variation, paired re-runs (median CV)", cells(f, _noise, "paired_throughput_cv")),
        ]
    return [
        ("device (resolved)", cells(f, number("{}"), "device")),
        ("precision (resolved)", cells(f, number("{}"), "precision")),
        ("tokens/s (benchmark)", cells(f, whole, "tokens_per_second")),
        (
            "tokens/s per interval (slowest – fastest)",
            cells(
                f,
                _rate_range,
                "benchmark:interval_steps_per_second_min",
                "benchmark:interval_steps_per_second_max",
                "steps_per_second",
                "tokens_per_second",
            ),
        ),
        ("throughput variation (CV)", cells(f, _noise, "throughput_cv")),
        (
            "other processes' CPU load (start / end)",
            cells(f, _load, "other_load_start", "other_load_end", "busy_machine"),
        ),
        *paired,
        (f"speed-up vs {c.reference}" + (" (paired)" if c.paired is not None else ""), speedup_cells(c)),
        ("optimizer steps/s", cells(f, number("{:.3f}"), "steps_per_second")),
        ("peak memory", cells(f, size, "peak_memory_bytes")),
        (
            "peak memory method",
            cells(f, recorded(lambda v: str(v) if v else NOT_RECORDED), "benchmark:peak_memory_method"),
        ),
        ("checkpoint save", cells(f, duration, "checkpoint_save_seconds")),
        ("checkpoint size", cells(f, size, "checkpoint_bytes")),
        ("time to first step", cells(f, duration, "time_to_first_step_seconds")),
        ("model FLOPs utilisation", cells(f, number("{:.1%}"), "mfu")),
        ("MFU's peak FLOP/s (source)", cells(f, _peak, "benchmark:peak_flops", "benchmark:peak_flops_source")),
        (
            "estimated full run",
            cells(f, partial(span, duration), "estimated_seconds", "estimated_seconds_low", "estimated_seconds_high"),
        ),
        ("planned tokens", cells(f, whole, "planned_tokens")),
        ("training tokens/s (train stage)", cells(f, whole, "train_tokens_per_second")),
        ("training time (train stage)", cells(f, duration, "train_elapsed_seconds")),
        (
            "final validation loss, nats/token (train stage)",
            # Per-token losses are not comparable across tokenizers (compare.tokenizer_note).
            ["not compared: tokenizers differ (bits/byte below)"] * len(f)
            if tokenizer_note(c.experiments)
            else cells(f, number("{:.3f}"), "final_validation_loss"),
        ),
        (
            "final validation loss, bits/byte (train stage)",
            cells(f, number("{:.4f}"), "final_validation_bits_per_byte"),
        ),
        (
            f"time to validation loss ≤ {c.target_loss:.2f} {UNITS[c.loss_key]} (train stage)"
            if c.target_loss is not None
            else "time to a validation loss both reach (train stage)",
            time_to_target_cells(c),
        ),
    ]


def time_to_target_cells(c: Comparison) -> list:
    def cell(rows: list) -> str:
        if not rows or c.target_loss is None:
            return NOT_RECORDED
        reached = time_to(rows, c.target_loss, c.loss_key)
        return "not reached" if reached is None else f"{duration(reached[0])} (step {reached[1]:,})"

    return [cell(c.curves.get(e.name) or []) for e in c.experiments]


def interval_note(c: Comparison) -> str:
    """How the speed-ups' intervals were formed, in words a reader can check."""
    if c.paired is not None:
        return (
            f"Speed-ups (paired): each experiment's benchmark was rerun {len(c.paired.rounds)} times on this machine, "
            "interleaved (the order alternating each round), each run in a fresh `python -m buildllm benchmark` "
            "process with its warm-up excluded; each round's tokens/s ratio to "
            f"{c.reference} is one pair; the speed-up is the median ratio and its interval the distribution-free "
            "interval for a median (order statistics by the sign test; 6 rounds are the fewest for 95%)."
        )
    return (
        "Speed-ups: the ratio of each run's tokens/s to "
        f"{c.reference}'s; the 95% interval comes from the spread of each run's measured intervals (Welch's t on "
        "log rates). It sees noise within each run, not a machine that was slower for a whole run; a run whose "
        f"intervals vary over {NOISY_CV:.0%} makes its speed-up inconclusive. For a comparison on one busy "
        "machine, use `buildllm compare A B --paired`."
    )


def paired_table(c: Comparison) -> Table:
    names = [e.name for e in c.experiments]
    rows = []
    for i, (measured, order) in enumerate(zip(c.paired.rounds, c.paired.orders), start=1):
        rates = [measured[n]["tokens_per_second"] for n in names]
        ratios = [f"{r / rates[0]:.3f}" for r in rates[1:]]
        rows.append([i, " → ".join(order), *[f"{r:,.0f}" for r in rates], *ratios])
    return Table(
        ["round", "order", *[f"{n} tokens/s" for n in names], *[f"{n} ÷ {names[0]}" for n in names[1:]]], rows, "paired"
    )


def controls_shown(c: Comparison) -> tuple[pd.DataFrame, list]:
    """The rows worth reading (variables, the course's controls, every difference) and the rest's names."""
    t = c.controls
    keep = (t["kind"] != "control") | ~t["same"] | t["control"].isin(KEY_CONTROLS) | (t["source"] == "data file")
    return t[keep], list(t.loc[~keep, "control"])


def status(row: pd.Series, experiments: int) -> str:
    if not row["same"]:
        return {"variable": "variable", "varied": "varied (--vary)"}.get(row["kind"], "DIFFERENT")
    if row["checked"] < 2:
        return "not checked (not recorded)"
    return "same where recorded" if row["checked"] < experiments else "same"


def rerun_block(c: Comparison, out: Path) -> str:
    lines = []
    for base in dict.fromkeys(e.baseline for e in c.experiments if e.baseline):
        lines.append(f"git checkout {base}        # the code and params.yaml these runs started from")
        lines.append("dvc pull corpus tokenize  # the same corpus and token files, if the project has a DVC remote")
        lines += [e.command for e in c.experiments if e.baseline == base]
    lines += [
        f"# {e.name}: measured on another machine; its folder keeps the metrics"
        for e in c.experiments
        if e.source == "folder"
    ]
    flags = "".join(f" --vary {v}" for v in c.vary) + (" --allow-different" if c.allow_different else "")
    flags += f" --paired --rounds {len(c.paired.rounds)}" if c.paired is not None else ""
    names = " ".join(e.name for e in c.experiments)
    lines.append(f"buildllm compare {names} --out {out.as_posix()}{flags}")
    return "\n".join(lines)


def sections(c: Comparison, out: Path, png: bytes, curves_png: bytes = b"") -> list:
    """The report, once: verdict, controls, results, chart, paired rounds, how to reproduce."""
    names = [e.name for e in c.experiments]
    shown, others = controls_shown(c)
    kinds = {e.source for e in c.experiments}
    sources = " and ".join(s for k, s in (("dvc", "`dvc exp show`"), ("folder", "metrics folders")) if k in kinds)
    statuses = [status(r, len(names)) for _, r in shown.iterrows()]
    also = Details(f"Also the same in every experiment: {len(others)} other params", ", ".join(others))
    blocks = [
        Heading(1, f"Device comparison: {' vs '.join(names)}"),
        Paragraph(f"Generated {c.created} by `buildllm compare` from {sources}.", muted=True),
        Verdict(c.verdict, c.tone),
        Bullets([f"Excluded **{name}**: {why}." for name, why in c.excluded], "excluded"),
        Heading(2, "Controls"),
        Table(
            ["control", "source", *names, "status"],
            [[r["control"], r["source"], *[r[n] for n in names], st] for (_, r), st in zip(shown.iterrows(), statuses)],
            "controls",
            [st.split()[0] for st in statuses],
        ),
        *([also] if others else []),
        Heading(2, "Results"),
        Table(["figure", *names], [[label, *values] for label, values in results_rows(c)], "results"),
        *([Paragraph(interval_note(c))] if c.speedups_shown and c.speedups else []),
        *([Paragraph(TARGET_NOTE)] if c.target_loss is not None else []),
        Bullets(list(c.notes), "notes"),
        Image("Device comparison chart", f"{out.name}.png", png),
        Image("Training curves", f"{out.name}_curves.png", curves_png, "curves"),
        *([Heading(2, "Paired re-measurements"), paired_table(c)] if c.paired is not None else []),
        Heading(2, "Reproduce"),
    ]
    for exp in c.experiments:
        if exp.source == "folder":
            origin = f"source: metrics folder `{exp.rev}`, measured on another machine"
            date = "not recorded in the folder"
        else:
            branch = f" ({exp.baseline_name})" if exp.baseline_name else ""
            origin = f"git revision: `{exp.rev}` (baseline `{exp.baseline}`{branch})"
            date = exp.timestamp or "uncommitted workspace, reported " + c.created
        environment = f"environment: {machine_line(exp.metric)}"
        blocks += [Heading(3, exp.name), Bullets([origin, f"date: {date}", f"command: `{exp.command}`", environment])]
    blocks += [Heading(3, "How to rerun"), Code(rerun_block(c, out), "bash")]
    dvc_runs = [e.name for e in c.experiments if e.source == "dvc" and e.rev != "workspace"]
    if dvc_runs:
        blocks.append(
            Paragraph(
                "Or fetch these very runs instead of rerunning them: "
                f"`dvc exp pull origin {' '.join(dvc_runs)}`. The stage names at the end of each "
                "command are the stages whose metrics changed in that experiment."
            )
        )
    return blocks


def write_report(c: Comparison, out: Path) -> list:
    out = out.with_suffix("") if out.suffix in (".md", ".csv", ".png", ".html") else out
    png_path = write_chart(c, out.with_name(out.name + ".png"))
    curves_path = write_curves(c.curves, c.target_loss, out.with_name(out.name + "_curves.png"), c.loss_key)
    md_path, csv_path, html_path = (out.with_name(out.name + s) for s in (".md", ".csv", ".html"))
    blocks = sections(c, out, png_path.read_bytes(), curves_path.read_bytes())
    atomic_write_text(md_path, to_markdown(blocks))
    atomic_write(csv_path, lambda tmp: c.frame.to_csv(tmp, index=False))
    atomic_write_text(html_path, to_html(blocks, "Device comparison: " + " vs ".join(e.name for e in c.experiments)))
    return [md_path, csv_path, png_path, html_path, curves_path]


def run_compare(names: list, out: str, allow_different: bool, vary: list | None, paired: bool, rounds: int | None):
    if rounds is not None and not paired:
        raise UserError(f"--rounds {rounds} applies to --paired only; add --paired to re-measure the benchmarks here")
    rounds = (6 if rounds is None else rounds) if paired else None
    json_line(
        action="compare",
        experiments=names or "workspace and the current baseline's experiments",
        out=out,
        vary=vary or [],
        allow_different=allow_different,
        paired_rounds=rounds,
    )
    comparison = compare(names, allow_different, vary, rounds=rounds)
    for name, why in comparison.excluded:
        print(f"excluded {name}: {why}")
    paths = write_report(comparison, Path(out))
    print(comparison.verdict)
    print("report written: " + ", ".join(str(p) for p in paths))
