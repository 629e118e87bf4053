"""Write a Comparison as <out>.md, <out>.csv, <out>.png and one self-contained <out>.html.

Every file leads with the verdict and the controls, as the course asks: a speed-up means nothing
until the controls are confirmed. The HTML inlines its chart and its styles, so it opens the same
with no network, mailed or archived. All four files are written atomically.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import pandas as pd

from buildllm import units
from buildllm.config import control_keys
from buildllm.atomic import atomic_path, atomic_write_text
from buildllm.report.compare import Comparison
from buildllm.report.chart import write_chart

# The course's controls, always shown (the config knobs declared as controls, and what the plan
# resolved them to); other controls are listed only when they differ.
KEY_CONTROLS = control_keys() + ("profile", "architecture", "parameters", "sequence_length", "vocab_size",
                                 "batch_size", "measured_steps")
NOT_RECORDED = "not recorded"


def duration(seconds) -> str:
    return NOT_RECORDED if _missing(seconds) else units.duration(seconds)


def size(n) -> str:
    return NOT_RECORDED if _missing(n) else units.size(n)


def number(fmt: str):
    return lambda v: NOT_RECORDED if _missing(v) else fmt.format(v)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def results_rows(c: Comparison) -> list:
    """(figure, one formatted value per experiment) for the results table."""
    f = c.frame
    reference = f["experiment"].iloc[0]
    speedups = (list(map(number("{:.2f}×"), f["speedup_vs_first"])) if c.speedups_shown
                else ["withheld"] * len(f))
    spans = [NOT_RECORDED if _missing(e) else f"{duration(e)} (range {duration(lo)} – {duration(hi)})"
             for e, lo, hi in zip(f["estimated_seconds"], f["estimated_seconds_low"], f["estimated_seconds_high"])]
    return [
        ("device (resolved)", [str(v) if not _missing(v) else NOT_RECORDED for v in f["device"]]),
        ("precision (resolved)", [str(v) if not _missing(v) else NOT_RECORDED for v in f["precision"]]),
        ("tokens/s (benchmark)", list(map(number("{:,.0f}"), f["tokens_per_second"]))),
        (f"speed-up vs {reference}", speedups),
        ("optimizer steps/s", list(map(number("{:.3f}"), f["steps_per_second"]))),
        ("throughput variation (CV)", list(map(number("{:.1%}"), f["throughput_cv"]))),
        ("peak memory", list(map(size, f["peak_memory_bytes"]))),
        ("checkpoint save", list(map(duration, f["checkpoint_save_seconds"]))),
        ("checkpoint size", list(map(size, f["checkpoint_bytes"]))),
        ("time to first step", list(map(duration, f["time_to_first_step_seconds"]))),
        ("model FLOPs utilisation", list(map(number("{:.1%}"), f["mfu"]))),
        ("estimated full run", spans),
        ("planned tokens", list(map(number("{:,.0f}"), f["planned_tokens"]))),
        ("training tokens/s (train stage)", list(map(number("{:,.0f}"), f["train_tokens_per_second"]))),
        ("training time (train stage)", list(map(duration, f["train_elapsed_seconds"]))),
        ("final validation loss (train stage)", list(map(number("{:.3f}"), f["final_validation_loss"]))),
    ]


def environment_line(row: pd.Series) -> str:
    def get(key):
        v = row.get(key)
        return None if _missing(v) or v == "" else v

    if get("processor") is None and get("torch_version") is None:
        return "not recorded (metrics/benchmark.json is absent or has no environment record)"
    gpu = f"{get('gpu_name')} ({size(get('gpu_memory_bytes'))})" if get("gpu_name") else "none"
    return (f"processor {get('processor') or NOT_RECORDED}; GPU {gpu}; memory {size(get('memory_total_bytes'))}; "
            f"PyTorch {get('torch_version') or NOT_RECORDED} (CUDA build {get('torch_cuda_version') or NOT_RECORDED}); "
            f"Python {get('python_version') or NOT_RECORDED}; {get('platform') or ''}; "
            f"BuildLLM {get('buildllm_version') or NOT_RECORDED}; {_int(get('threads'))} threads")


def _int(v):
    return NOT_RECORDED if v is None else int(v)


def controls_shown(c: Comparison) -> tuple[pd.DataFrame, list]:
    """The rows worth reading (variables, the course's controls, every difference) and the rest's names."""
    t = c.controls
    keep = (t["kind"] != "control") | ~t["same"] | t["control"].isin(KEY_CONTROLS) | (t["source"] == "data file")
    return t[keep], list(t.loc[~keep, "control"])


def status(row: pd.Series) -> str:
    if row["kind"] == "variable":
        return "variable"
    if row["kind"] == "varied":
        return "varied (--vary)"
    return "same" if row["same"] else "DIFFERENT"


def rerun_block(c: Comparison, out: Path) -> str:
    baselines = list(dict.fromkeys(e.baseline for e in c.experiments if e.baseline))
    lines = []
    for base in baselines:
        lines.append(f"git checkout {base}        # the code and params.yaml these runs started from")
        lines.append("dvc pull corpus tokenize  # the same corpus and token files, if the project has a DVC remote")
        lines += [e.command for e in c.experiments if e.baseline == base]
    flags = "".join(f" --vary {v}" for v in c.vary) + (" --allow-different" if c.allow_different else "")
    names = " ".join(e.name for e in c.experiments)
    lines.append(f"buildllm compare {names} --out {out.as_posix()}{flags}")
    return "\n".join(lines)


def markdown(c: Comparison, out: Path) -> str:
    names = [e.name for e in c.experiments]
    shown, others = controls_shown(c)
    md = [f"# Device comparison: {' vs '.join(names)}", "",
          f"Generated {c.created} by `buildllm compare` from `dvc exp show`.", "",
          f"> **{c.verdict}**", ""]
    md += [f"- Excluded **{name}**: {why}." for name, why in c.excluded] + ([""] if c.excluded else [])
    md += ["## Controls", "", _md_table(["control", "source", *names, "status"],
                                        [[r["control"], r["source"], *[r[n] for n in names], status(r)]
                                         for _, r in shown.iterrows()])]
    if others:
        md += ["", f"Also the same in every experiment: {len(others)} other params ({', '.join(others)})."]
    results = [[label, *values] for label, values in results_rows(c)]
    md += ["", "## Results", "", _md_table(["figure", *names], results), ""]
    md += [f"- {note}" for note in c.notes] + ([""] if c.notes else [])
    md += [f"![Device comparison chart]({out.name}.png)", ""]
    md += ["## Reproduce", ""]
    for exp, (_, row) in zip(c.experiments, c.frame.iterrows()):
        branch = f" ({exp.baseline_name})" if exp.baseline_name else ""
        md += [f"### {exp.name}", "",
               f"- git revision: `{exp.rev}` (baseline `{exp.baseline}`{branch})",
               f"- date: {exp.timestamp or 'uncommitted workspace, reported ' + c.created}",
               f"- command: `{exp.command}`",
               f"- environment: {environment_line(row)}", ""]
    md += ["### How to rerun", "", "```bash", rerun_block(c, out), "```", "",
           "Or fetch these very runs instead of rerunning them: "
           f"`dvc exp pull origin {' '.join(e.name for e in c.experiments if e.rev != 'workspace')}`.",
           "The stage names at the end of each command are the stages whose metrics changed in that experiment.", ""]
    return "\n".join(md)


def _md_table(header: list, rows: list) -> str:
    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, row)) + " |" for row in rows])


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#1d1d1f;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.verdict{padding:.8em 1em;border-radius:6px;font-weight:600}
.ok{background:#e7f5ea;border-left:6px solid #2e8540}.warn{background:#fdecea;border-left:6px solid #c0392b}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}th,td{border:1px solid #d0d0d0;padding:.3em .6em;text-align:left}
th{background:#f3f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.DIFFERENT td{background:#fdecea}tr.variable td,tr.varied td{background:#eef4fb}
img{max-width:100%;border:1px solid #eee}pre{background:#f6f8fa;padding:.8em;overflow-x:auto}
code{background:#f6f8fa;padding:0 .2em}.muted{color:#666}
"""


def html_page(c: Comparison, out: Path, png: bytes) -> str:
    e = html.escape
    names = [x.name for x in c.experiments]
    shown, others = controls_shown(c)
    verdict_class = "ok" if c.equal_budget else "warn"
    title = e("Device comparison: " + " vs ".join(names))
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{title}</h1>",
             f"<p class='muted'>Generated {e(c.created)} by <code>buildllm compare</code> from <code>dvc exp show</code>.</p>",
             f"<p class='verdict {verdict_class}' id='verdict'>{e(c.verdict)}</p>"]
    if c.excluded:
        items = "".join(f"<li>Excluded <b>{e(n)}</b>: {e(w)}.</li>" for n, w in c.excluded)
        parts.append(f"<ul id='excluded'>{items}</ul>")
    parts.append("<h2>Controls</h2>")
    rows = [([r["control"], r["source"], *[r[n] for n in names], status(r)], status(r).split()[0])
            for _, r in shown.iterrows()]
    parts.append(_html_table(["control", "source", *names, "status"], rows, "controls"))
    if others:
        parts.append(f"<details><summary>Also the same in every experiment: {len(others)} other params</summary>"
                     f"<p>{e(', '.join(others))}</p></details>")
    parts.append("<h2>Results</h2>")
    results = [([label, *values], "") for label, values in results_rows(c)]
    parts.append(_html_table(["figure", *names], results, "results"))
    if c.notes:
        parts.append("<ul id='notes'>" + "".join(f"<li>{e(n)}</li>" for n in c.notes) + "</ul>")
    encoded = base64.b64encode(png).decode("ascii")
    parts.append(f"<p><img id='chart' alt='Device comparison chart' src='data:image/png;base64,{encoded}'></p>")
    parts.append("<h2>Reproduce</h2>")
    for exp, (_, row) in zip(c.experiments, c.frame.iterrows()):
        branch = f" ({exp.baseline_name})" if exp.baseline_name else ""
        parts.append(f"<h3>{e(exp.name)}</h3><ul>"
                     f"<li>git revision: <code>{e(exp.rev)}</code> (baseline <code>{e(exp.baseline)}</code>{e(branch)})</li>"
                     f"<li>date: {e(exp.timestamp or 'uncommitted workspace, reported ' + c.created)}</li>"
                     f"<li>command: <code>{e(exp.command)}</code></li>"
                     f"<li>environment: {e(environment_line(row))}</li></ul>")
    parts.append(f"<h3>How to rerun</h3><pre>{e(rerun_block(c, out))}</pre></body></html>")
    return "\n".join(parts)


def _html_table(header: list, rows: list, ident: str) -> str:
    def cell(v):
        text = html.escape(str(v))
        return f"<td class='num'>{text}</td>" if text[:1].isdigit() else f"<td>{text}</td>"

    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(f"<tr class='{cls}'>" + "".join(map(cell, row)) + "</tr>" for row, cls in rows)
    return f"<table id='{ident}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_report(c: Comparison, out: Path) -> list:
    """Write the four files next to each other; return their paths."""
    out = out.with_suffix("") if out.suffix in (".md", ".csv", ".png", ".html") else out
    base = out.parent / out.name
    png_path = write_chart(c.frame, base.with_name(base.name + ".png"), c.speedups_shown,
                           "not an equal-budget comparison" if not c.speedups_shown else "")
    md_path, csv_path, html_path = (base.with_name(base.name + s) for s in (".md", ".csv", ".html"))
    atomic_write_text(md_path, markdown(c, out))
    with atomic_path(csv_path) as tmp:
        c.frame.to_csv(tmp, index=False)
    atomic_write_text(html_path, html_page(c, out, png_path.read_bytes()))
    return [md_path, csv_path, png_path, html_path]
