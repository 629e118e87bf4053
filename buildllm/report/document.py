"""A report as a list of blocks, built once and written as Markdown or as self-contained HTML, so
a section is never written twice. Paragraphs and lists may carry `code` and **bold**, which HTML
turns into <code> and <b>; table cells are plain text.

Why hand-written, not a library: a Markdown renderer (markdown-it-py, Python-Markdown) would turn
the Markdown into HTML, but the page needs what Markdown cannot say: ids the HTML check and the
tests find (#verdict, #controls, #results), a class per table row (a DIFFERENT control in red),
numbers right-aligned, the verdict's tone, side-by-side columns and charts inlined as data: URIs;
post-processing its output would be longer than this. A template engine (Jinja2) would move the
same branches into a template beside these blocks. Every text is escaped here (html.escape).
"""

from __future__ import annotations

import base64
import html
import re
from typing import NamedTuple


class Heading(NamedTuple):
    level: int
    text: str


class Paragraph(NamedTuple):
    text: str
    muted: bool = False


class Verdict(NamedTuple):
    text: str
    tone: str  # ok | caution | warn


class Bullets(NamedTuple):
    items: list
    ident: str = ""


class Table(NamedTuple):
    header: list
    rows: list  # lists of cells
    ident: str
    classes: list | None = None  # one CSS class per row (HTML only)
    text_columns: tuple = ()  # columns of sentences: never right-aligned as numbers (HTML only)


class Image(NamedTuple):
    alt: str
    filename: str  # Markdown links to the file beside it
    png: bytes  # HTML inlines it
    ident: str = "chart"


class Details(NamedTuple):
    summary: str
    text: str


class Code(NamedTuple):
    text: str
    language: str = ""


class Columns(NamedTuple):
    columns: list  # lists of blocks: side by side on a wide page, one after another in Markdown


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1180px;margin:2em auto;
padding:0 1em;color:#1d1d1f;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.verdict{padding:.8em 1em;border-radius:6px;font-weight:600}
.ok{background:#e7f5ea;border-left:6px solid #2e8540}.warn{background:#fdecea;border-left:6px solid #c0392b}
.caution{background:#fff4e0;border-left:6px solid #d68910}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #d0d0d0;padding:.3em .6em;text-align:left}
th{background:#f3f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.DIFFERENT td{background:#fdecea}tr.variable td,tr.varied td{background:#eef4fb}
img{max-width:100%;border:1px solid #eee}pre{background:#f6f8fa;padding:.8em;overflow-x:auto}
code{background:#f6f8fa;padding:0 .2em}.muted{color:#666}pre.sample{white-space:pre-wrap;font-size:1.05em}
.columns{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:0 1.6em;align-items:start}
"""


def to_markdown(blocks: list) -> str:
    out = []
    for b in blocks:
        if isinstance(b, Columns):
            out += [to_markdown(column) for column in b.columns]
        elif isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Paragraph):
            out += [b.text, ""]
        elif isinstance(b, Verdict):
            out += [f"> **{b.text}**", ""]
        elif isinstance(b, Bullets):
            out += [f"- {item}" for item in b.items] + ([""] if b.items else [])
        elif isinstance(b, Table):
            out += [_md_table(b.header, b.rows), ""]
        elif isinstance(b, Image):
            out += [f"![{b.alt}]({b.filename})", ""]
        elif isinstance(b, Details):
            out += [f"{b.summary} ({b.text}).", ""]
        elif isinstance(b, Code):
            out += ["```" + b.language, b.text, "```", ""]
    return "\n".join(out)


def _md_table(header: list, rows: list) -> str:
    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, row)) + " |" for row in rows])


def _inline(text: str) -> str:
    escaped = html.escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", escaped)


def to_html(blocks: list, title: str) -> str:
    head = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
    ]
    return "\n".join(head + _html_blocks(blocks) + ["</body></html>"])


def _html_blocks(blocks: list) -> list:
    e = html.escape
    parts = []
    for b in blocks:
        if isinstance(b, Columns):
            inner = "".join("<div>" + "\n".join(_html_blocks(column)) + "</div>" for column in b.columns)
            parts.append(f"<div class='columns'>{inner}</div>")
        elif isinstance(b, Heading):
            parts.append(f"<h{b.level}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            muted = " class='muted'" if b.muted else ""
            parts.append(f"<p{muted}>{_inline(b.text)}</p>")
        elif isinstance(b, Verdict):
            parts.append(f"<p class='verdict {b.tone}' id='verdict'>{e(b.text)}</p>")
        elif isinstance(b, Bullets) and b.items:
            ident = f" id='{b.ident}'" if b.ident else ""
            parts.append(f"<ul{ident}>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            parts.append(_html_table(b))
        elif isinstance(b, Image):
            encoded = base64.b64encode(b.png).decode("ascii")
            parts.append(f"<p><img id='{b.ident}' alt='{e(b.alt)}' src='data:image/png;base64,{encoded}'></p>")
        elif isinstance(b, Details):
            parts.append(f"<details><summary>{_inline(b.summary)}</summary><p>{e(b.text)}</p></details>")
        elif isinstance(b, Code):
            parts.append(f"<pre class='{e(b.language)}'>{e(b.text)}</pre>" if b.language else f"<pre>{e(b.text)}</pre>")
    return parts


def _html_table(t: Table) -> str:
    def cell(column, v):
        text = html.escape(str(v))
        number = text[:1].isdigit() and column not in t.text_columns
        return f"<td class='num'>{text}</td>" if number else f"<td>{text}</td>"

    classes = t.classes or [""] * len(t.rows)
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in t.header)
    body = "".join(
        f"<tr class='{cls}'>" + "".join(cell(i, v) for i, v in enumerate(row)) + "</tr>"
        for row, cls in zip(t.rows, classes)
    )
    return f"<table id='{t.ident}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
