"""`buildllm report` and the DVC `report` stage: one run on one page, the run card.

What a learner looks at after a run: the plan and why, where the memory and a step's time went, the
speed and MFU, the estimate against the real time, the loss against the unigram and uniform levels,
and a sample of text. One self-contained HTML page (charts and styles inline: it opens offline,
mailed or archived) and a PNG of it, drawn by headless Chromium with networking off when it is
installed, else composed by matplotlib (the page says which).
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from buildllm.atomic import atomic_write, atomic_write_text
from buildllm.config import Config
from buildllm.metrics import is_note, json_line
from buildllm.report import card_charts
from buildllm.report.browser import screenshot
from buildllm.report.card_charts import NOT_RECORDED, duration, machine_line, number, size, span
from buildllm.report.card_data import PLAN_STAGES, CardData, read_card
from buildllm.report.document import Bullets, Code, Columns, Heading, Image, Paragraph, Table, to_html
from buildllm.report.sample import write_sample

CARD_PATH = Path("plots/run_card")  # the stage's: .html and .png, committed with each experiment
# (label, key in the records, key of its reason in the notes): the plan's decisions, in reading order.
DECISIONS = [
    ("device", "device", "device_reason"),
    ("precision", "precision", "precision_reason"),
    ("batch size (per process)", "batch_size", "batch_size_reason"),
    ("gradient accumulation", "grad_accum", None),
    ("tokens per optimizer step", "tokens_per_step", None),
    ("data-loader workers", "workers", "workers_reason"),
    ("CPU threads", "threads", "threads_reason"),
    ("processes", "processes", None),
    ("torch.compile", "compile_enabled", "compile_reason"),
    ("fused AdamW", "fused_adamw", "fused_adamw_reason"),
    ("fp16 grad scaler", "grad_scaler", None),
    ("TF32 matmuls", "tf32_enabled", None),
    ("gradient checkpointing", "gradient_checkpointing", None),
    ("recipe", "recipe", "recipe_reason"),
    ("optimizer", "optimizer", "optimizer_reason"),
    ("parameters Muon updates (AdamW: the rest)", "muon_parameters", "optimizer_groups_reason"),
    ("schedule", "schedule", "schedule_reason"),
    ("learning rate (peak, AdamW)", "learning_rate", "learning_rate_reason"),
    ("Muon learning rate (peak)", "muon_learning_rate", "muon_learning_rate_reason"),
    ("planned optimizer steps", "planned_steps", None),
]


def _shown(value) -> str:
    if value is None:
        return NOT_RECORDED
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:,}" if isinstance(value, int) else f"{value:.3g}" if isinstance(value, float) else str(value)


def flops(rate: float) -> str:
    return f"{rate / 1e12:.3g} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.3g} GFLOP/s"


def measured_time(d: CardData) -> tuple[float | None, str]:
    """The run's training time and what it covers: the whole run's, also across a resume."""
    if "train" not in d.records:
        return None, NOT_RECORDED
    logged = [r["elapsed_seconds"] for r in d.rows if r.get("elapsed_seconds") is not None]
    if d.get("train", "resumed"):
        if not logged:
            return None, "not recorded (a resumed run from before the log kept elapsed_seconds)"
        return logged[-1], "measured: the train loop's time over all sessions, up to the last log row"
    if d.get("train", "run_seconds") is not None:  # what the estimate projects, and the console judged
        return d.get("train", "run_seconds"), "measured: the train command, start-up included"
    return d.get("train", "elapsed_seconds"), "measured: the train loop, first step to end"


def loss_lines(d: CardData) -> list:
    loss, vocab = d.get("train", "final_validation_loss"), d.first("vocab_size")
    unigram = d.get("train", "unigram_validation_loss")
    if loss is None and d.get("train", "last_validation_loss") is not None:
        loss, step = d.get("train", "last_validation_loss"), d.get("train", "last_validation_step")
        head = f"last validation loss {loss:.3f} (step {step}; the run did not finish)"
    else:
        head = NOT_RECORDED if loss is None else f"final validation loss {loss:.3f} nats per token"
    bits = d.get("train", "final_validation_bits_per_byte") or d.get("train", "last_validation_bits_per_byte")
    if bits is not None:  # buildllm/data/text_bytes.py: comparable across tokenizers
        head += f", {bits:.4f} bits per byte of the validation text"
    lines = [head]
    if loss is not None and unigram is not None:
        gap = unigram - loss
        lines.append(
            f"{abs(gap):.3f} nats {'below' if gap > 0 else 'above'} the unigram level {unigram:.3f} "
            f"({'the model uses context' if gap > 0 else 'no sign yet that it uses context'})"
        )
    if vocab:
        lines.append(f"uniform guess ln {vocab:,} = {math.log(vocab):.3f}")
    return lines


def headline(d: CardData) -> list:
    t, b, e = d.records.get("train", {}), d.records.get("benchmark", {}), d.records.get("estimate", {})
    seconds, _ = measured_time(d)
    low, high = e.get("estimated_seconds_low"), e.get("estimated_seconds_high")
    versus = f"{duration(seconds)} measured; estimate {span(duration, e.get('estimated_seconds'), low, high)}"
    if seconds is not None and low is not None and high is not None:
        where = "within" if low <= seconds <= high else "above" if seconds > high else "below"
        versus += f": {where} the range"
    if load := d.note("train", "busy_machine_reason"):  # beside the verdict: were the run's cores its own?
        versus += f"; {load}"  # device/load.py run_load_line
    peak, source = b.get("peak_flops"), d.note("benchmark", "peak_flops_source")
    method = d.note("benchmark", "peak_memory_method") or "method not recorded"
    peaks = f"training {size(t.get('peak_memory_bytes'))}; benchmark {size(b.get('peak_memory_bytes'))} ({method})"
    variation = f" (interval variation {b['throughput_cv']:.1%})" if b.get("throughput_cv") is not None else ""
    memory = [d.get("dry_run", f"memory_estimate_{k}_bytes") for k in ("total", "low", "high")]
    mfu = NOT_RECORDED
    if b.get("mfu") is not None:
        of = f"of a {flops(peak)} peak ({source or 'source not recorded'})" if peak else "(peak not recorded)"
        mfu = f"{b['mfu']:.1%} {of}"
    rate = number("{:,.0f} tokens/s")
    return [
        ("status", _shown(t.get("status"))),
        ("loss", "; ".join(loss_lines(d))),
        ("training throughput (this session)", rate(t.get("tokens_per_second"))),
        ("benchmark throughput", rate(b.get("tokens_per_second")) + variation),
        ("model FLOPs utilisation (benchmark)", mfu),
        ("peak memory, measured", peaks),
        ("memory estimate (dry run)", span(size, *memory)),
        ("run time against the estimate", versus),
        ("tokens trained", _shown(t.get("tokens_processed"))),
    ]


def machine_blocks(d: CardData) -> list:
    machine = d.records.get("machine")
    if machine is None:
        rows = [["fingerprint", "not recorded (metrics/machine.json is absent: the machine stage did not run)"]]
    else:
        rows = []
        for key, v in machine.items():
            in_bytes = key.endswith("_bytes") and isinstance(v, (int, float))
            rows.append([key, size(v) if in_bytes else _shown(d.note("machine", key))])
    return [
        Heading(2, "Machine"),
        Table(["fingerprint", "value"], rows, "machine"),
        Paragraph(
            f"What the benchmark recorded of it: {machine_line(d.records.get('benchmark', {}).get)}.", muted=True
        ),
    ]


def plan_table(d: CardData) -> Table:
    rows = []
    for label, key, reason in DECISIONS:
        why = (d.first(reason, notes=True) or "reason not recorded") if reason else ""
        rows.append([label, _shown(d.first(key)), why])
    shown = {reason for _, _, reason in DECISIONS}
    for stage in PLAN_STAGES:
        for key, text in d.notes.get(stage, {}).items():
            if is_note(key) and key not in shown:
                shown.add(key)
                rows.append([key.replace("_", " "), "", text])
    return Table(["decision", "value", "why"], rows, "plan", text_columns=(2,))


def memory_table(d: CardData) -> Table:
    rows = [[label, size(d.get("dry_run", f"memory_estimate_{key}_bytes"))] for key, label in card_charts.MEMORY_PARTS]
    rows.append(["estimate, total", size(d.get("dry_run", "memory_estimate_total_bytes"))])
    return Table(["part", "bytes"], rows, "memory")


def sample_blocks(d: CardData) -> list:
    s = d.sample or {}
    if not s.get("text"):
        why = s.get("missing_reason") or "metrics/sample_notes.json is absent"
        return [Heading(2, "A sample of its text"), Paragraph(f"{NOT_RECORDED}: {why}.")]
    how = (
        f"From checkpoint step {s.get('checkpoint_step')}, prompt “{s.get('prompt')}”, {s.get('new_tokens')} new "
        f"tokens at temperature {s.get('temperature')}, top-k {s.get('top_k')}, seed {s.get('seed')}, on the "
        f"{s.get('device')}:"
    )
    return [Heading(2, "A sample of its text"), Paragraph(how), Code(s["text"], "sample")]


def title(d: CardData) -> str:
    return f"Run card: {_shown(d.first('profile'))} on {_shown(d.first('device'))} ({_shown(d.first('precision'))})" + (
        "" if d.name == "workspace" else f", experiment {d.name}"
    )


def charts(d: CardData) -> dict:
    """The card's charts as images of the page, each named once: "loss" is loss.png, its alt text and its id."""
    seconds, covers = measured_time(d)
    r = d.records
    drawn = {
        "memory": card_charts.memory_chart(r.get("dry_run", {}), r.get("benchmark", {}), r.get("train", {})),
        "step": card_charts.step_chart(r.get("benchmark", {})),
        "time": card_charts.estimate_chart(r.get("estimate", {}), seconds, covers.split(":")[0]),
        "loss": card_charts.loss_chart(d.rows, d.get("train", "unigram_validation_loss"), d.first("vocab_size")),
    }
    return {chart: Image(f"{chart} chart", f"{chart}.png", png, f"{chart}-chart") for chart, png in drawn.items()}


def sections(d: CardData, pictures: dict, created: str, drawn_by: str) -> list:
    origin = "the workspace" if d.rev == "workspace" else f"{d.name} (`{d.rev}`)"
    seconds, covers = measured_time(d)
    top = [
        [Table(["figure", "value"], [list(r) for r in headline(d)], "headline", text_columns=(1,))],
        [pictures["loss"]],
    ]
    memory = [Heading(2, "Memory"), pictures["memory"], memory_table(d)]
    time = [
        Heading(2, "Where a step's time goes"),
        pictures["step"],
        Paragraph(
            "Measured by the benchmark on a few of the training step's own steps, each part between "
            "device synchronisations; validation and checkpoint time are spread over the steps between "
            "them. A large data share says add workers; a large optimizer share at a small batch says "
            "raise the batch size.",
            muted=True,
        ),
        Heading(2, "Time: the estimate against the run"),
        pictures["time"],
        Paragraph(
            f"{covers} ({duration(seconds)}): validation and checkpoint saves included, process "
            f"start-up not. The estimate (from the benchmark's slowest and fastest intervals) also "
            f"counts start-up: {duration(d.get('estimate', 'startup_seconds'))}.",
            muted=True,
        ),
    ]
    missing = [f"`{path}`: {why}" for path, why in d.absent.items()]
    return [
        Heading(1, title(d)),
        Paragraph(f"Generated {created} by `buildllm report` from {origin}; its PNG drawn by {drawn_by}.", muted=True),
        Columns(top),
        Columns([memory, time]),
        Columns([sample_blocks(d), machine_blocks(d)]),
        Heading(2, "The plan: what was decided, and why"),
        plan_table(d),
        Heading(2, "Sources"),
        Bullets([f"read from {origin}: " + ", ".join(f"`metrics/{s}.json`" for s in d.records)] + missing),
    ]


def write_card(d: CardData, out: Path) -> dict:
    created = datetime.now().astimezone().isoformat(timespec="seconds")
    html_path, png_path = out.with_name(out.name + ".html"), out.with_name(out.name + ".png")
    pictures = charts(d)
    how = "headless Chromium, networking off"
    atomic_write_text(html_path, to_html(sections(d, pictures, created, how), title(d)))
    why_not = screenshot(html_path, png_path)
    if why_not is not None:  # the page says how its picture was made
        how = f"matplotlib, a composed page ({why_not})"
        atomic_write_text(html_path, to_html(sections(d, pictures, created, how), title(d)))
        lines = [f"{label}: {value}" for label, value in headline(d)]
        png = card_charts.composed_page(title(d), lines, [image.png for image in pictures.values()])
        atomic_write(png_path, lambda tmp: tmp.write_bytes(png))
    return {"html": str(html_path), "png": str(png_path), "png_drawn_by": how}


def report(config: Config, experiment: str | None = None, out: str | None = None) -> dict:
    """`buildllm report`: the workspace's card (a fresh sample first), or a named experiment's."""
    workspace = experiment in (None, "workspace")
    target = Path(out) if out else CARD_PATH if workspace else Path("reports") / f"run_card_{Path(experiment).name}"
    sample = {"sample": "generating from the checkpoint on the CPU"} if workspace else {}
    json_line(action="report", experiment=experiment or "workspace", out=str(target), **sample)
    if workspace:
        write_sample(config)
    data = read_card(None if workspace else experiment)
    written = write_card(data, target)
    print(f"run card written: {written['html']}, {written['png']} (PNG drawn by {written['png_drawn_by']})")
    return written
