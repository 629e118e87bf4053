"""Check that a comparison report's HTML renders on its own: chart and tables, with networking off.

    python scripts/check_report_html.py reports/device_comparison.html [--screenshot shot.png]

Three checks: (1) the file references nothing outside itself (no http(s) or file links; images are
data: URIs); (2) headless Chromium, with every host unresolvable and a dead proxy, loads a copy of
the page with a small probe script added, and the probe reports that the chart image decoded and
the controls and results tables have rows and height; (3) optionally a screenshot of the page as
it is, to look at. Prints one JSON line of findings; exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """<script>
window.addEventListener('load', () => {
  const box = (el) => el ? Math.round(el.getBoundingClientRect().height) : 0;
  const images = [...document.images];
  const result = {
    images: images.length,
    decoded: images.filter((i) => i.complete && i.naturalWidth > 0).length,
    chart_width: images.length ? images[0].naturalWidth : 0,
    chart_height_px: box(document.getElementById('chart')),
    tables: Object.fromEntries([...document.querySelectorAll('table')].map((t) => [t.id, [t.rows.length, box(t)]])),
    verdict: (document.getElementById('verdict') || {}).textContent || '',
    fetched: performance.getEntriesByType('resource').map((e) => e.name),
  };
  const out = document.createElement('pre');
  out.id = 'probe-result';
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>"""
# Networking off: every name resolves to nothing and any proxy use hits a closed port.
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", "--disable-gpu", "--no-sandbox", "--headless", "--hide-scrollbars"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def external_references(text: str) -> list:
    """Every src/href/url() that points outside the file itself."""
    refs = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]*)['"]""", text, flags=re.I)
    refs += re.findall(r"""url\(\s*['"]?([^'")]*)""", text, flags=re.I)
    refs += re.findall(r"""@import\s+['"]([^'"]+)""", text, flags=re.I)
    return [r for r in refs if not (r.startswith("data:") or r.startswith("#"))]


def run_chromium(browser: str, args: list, profile: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [browser, *OFFLINE, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check(report: Path, screenshot: Path | None = None) -> dict:
    text = report.read_text(encoding="utf-8")
    findings = {"report": str(report), "external_references": external_references(text)}
    browser = chromium()
    if browser is None:
        raise SystemExit("chromium not found; install it (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        probed = tmp / "probed.html"
        probed.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
        done = run_chromium(browser, ["--virtual-time-budget=10000", "--dump-dom", probed.as_uri()], tmp / "profile")
        match = re.search(r'<pre id="probe-result">(.*?)</pre>', done.stdout, flags=re.S)
        if not match:
            raise SystemExit(f"chromium rendered no probe result (exit {done.returncode}): {done.stderr[-400:]}")
        findings.update(json.loads(html.unescape(match.group(1))))
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            shot = run_chromium(browser, ["--window-size=1280,2600", f"--screenshot={screenshot.resolve()}",
                                          report.resolve().as_uri()], tmp / "profile2")
            findings["screenshot"] = str(screenshot) if screenshot.exists() else f"failed: {shot.stderr[-300:]}"
    tables = findings.get("tables", {})
    findings["problems"] = [problem for ok, problem in [
        (not findings["external_references"], f"references outside the file: {findings['external_references'][:3]}"),
        (findings.get("images", 0) >= 1 and findings.get("decoded") == findings.get("images"),
         "the chart image did not decode"),
        (findings.get("chart_height_px", 0) > 100, "the chart has no height on the page"),
        (all(tables.get(t, [0, 0])[0] > 1 and tables.get(t, [0, 0])[1] > 0 for t in ("controls", "results")),
         "the controls or results table is missing or empty"),
        (not [u for u in findings.get("fetched", []) if not u.startswith("data:")], "the page fetched resources"),
    ] if not ok]
    return findings


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--screenshot", type=Path, default=None)
    args = parser.parse_args(argv)
    findings = check(args.report, args.screenshot)
    print(json.dumps(findings))
    return 1 if findings["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
