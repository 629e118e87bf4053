"""Check that a report's HTML (a comparison, a run card) renders on its own: charts and tables, networking off.

    python -m lab.check_report_html reports/device_comparison.html [--screenshot shot.png]

Three checks: (1) the file references nothing outside itself (no http(s) or file links; images are
data: URIs); (2) headless Chromium, with every host unresolvable and a dead proxy, loads a copy of
the page with a small probe script added, and the probe reports that the chart image decoded and
the controls and results tables have rows and height; (3) optionally a screenshot of the page as
it is, to look at. Prints one JSON line of findings; exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from buildllm.report.browser import chromium, probe, run_chromium

# What the probe (buildllm/report/browser.py) also reports about a report page.
PAGE = """chart_width: images.length ? images[0].naturalWidth : 0,
    chart_height_px: box(images[0]),
    tables: Object.fromEntries([...document.querySelectorAll('table')].map((t) => [t.id, [t.rows.length, box(t)]])),
    verdict: (document.getElementById('verdict') || {}).textContent || '',"""


def external_references(text: str) -> list:
    """Every src/href/url() that points outside the file itself."""
    refs = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]*)['"]""", text, flags=re.I)
    refs += re.findall(r"""url\(\s*['"]?([^'")]*)""", text, flags=re.I)
    refs += re.findall(r"""@import\s+['"]([^'"]+)""", text, flags=re.I)
    return [r for r in refs if not (r.startswith("data:") or r.startswith("#"))]


def check(report: Path, screenshot: Path | None = None, tables: tuple = ("controls", "results")) -> dict:
    """Findings about the page; `tables`: the ids of tables that must have rows (a comparison's by default)."""
    text = report.read_text(encoding="utf-8")
    findings = {"report": str(report), "external_references": external_references(text)}
    browser = chromium()
    if browser is None:
        raise SystemExit("chromium not found; install it (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        found = probe(browser, report, tmp, PAGE)
        if not found:
            raise SystemExit("chromium rendered no probe result")
        findings.update(found)
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            shot = run_chromium(
                browser,
                ["--window-size=1280,2600", f"--screenshot={screenshot.resolve()}", report.resolve().as_uri()],
                tmp / "profile2",
            )
            findings["screenshot"] = str(screenshot) if screenshot.exists() else f"failed: {shot.stderr[-300:]}"
    shown = findings.get("tables", {})
    findings["problems"] = [
        problem
        for ok, problem in [
            (
                not findings["external_references"],
                f"references outside the file: {findings['external_references'][:3]}",
            ),
            (
                findings.get("images", 0) >= 1 and findings.get("decoded") == findings.get("images"),
                "the chart image did not decode",
            ),
            (findings.get("chart_height_px", 0) > 100, "the chart has no height on the page"),
            (
                all(shown.get(t, [0, 0])[0] > 1 and shown.get(t, [0, 0])[1] > 0 for t in tables),
                f"a table ({', '.join(tables)}) is missing or empty",
            ),
            (not [u for u in findings.get("fetched", []) if not u.startswith("data:")], "the page fetched resources"),
        ]
        if not ok
    ]
    return findings


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--screenshot", type=Path, default=None)
    parser.add_argument(
        "--tables",
        nargs="*",
        default=["controls", "results"],
        metavar="ID",
        help="ids of the tables that must have rows (default: a comparison's, controls results)",
    )
    args = parser.parse_args(argv)
    findings = check(args.report, args.screenshot, tuple(args.tables))
    print(json.dumps(findings))
    return 1 if findings["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
