"""Headless Chromium with networking off: a self-contained page drawn as a browser draws it, which
shows that it needs nothing else. Used for the run card's PNG and by lab/check_report_html.py."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from buildllm.atomic import atomic_path

WIDTH, MAX_HEIGHT = 1280, 16000  # px: a laptop's browser window; a taller page is cut there
# Networking off: every name resolves to nothing and any proxy use hits a closed port.
OFFLINE = [
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=http://127.0.0.1:9",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-gpu",
    "--no-sandbox",
    "--headless",
    "--hide-scrollbars",
]
# A script added to a copy of the page: after load it writes what it found into the DOM, which
# `--dump-dom` prints. `extra` is more JavaScript object members (see check_report_html.py).
PROBE = """<script>
window.addEventListener('load', () => {
  const box = (el) => el ? Math.round(el.getBoundingClientRect().height) : 0;
  const images = [...document.images];
  const result = {
    images: images.length,
    decoded: images.filter((i) => i.complete && i.naturalWidth > 0).length,
    page_height_px: Math.ceil(document.documentElement.scrollHeight),
    text: document.body.innerText,
    fetched: performance.getEntriesByType('resource').map((e) => e.name),
    %s
  };
  const out = document.createElement('pre');
  out.id = 'probe-result';
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
});
</script>"""


def chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome"))), None)


def run_chromium(browser: str, args: list, profile: Path) -> subprocess.CompletedProcess:
    cmd = [browser, *OFFLINE, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _settled(browser: str, uri: str, height: int, action: str, profile: Path) -> subprocess.CompletedProcess:
    """`action` on the page at `uri` in a WIDTH-wide window, after up to 10 s of virtual time to load."""
    return run_chromium(
        browser, ["--virtual-time-budget=10000", f"--window-size={WIDTH},{height}", action, uri], profile
    )


def probe(browser: str, page: Path, work: Path, extra: str = "") -> dict:
    """What the page holds once Chromium has loaded it offline (see PROBE); {} if it rendered nothing."""
    text = page.read_text(encoding="utf-8")
    probed = work / "probed.html"
    probed.write_text(text.replace("</body>", PROBE % extra + "</body>"), encoding="utf-8")
    done = _settled(browser, probed.as_uri(), 1000, "--dump-dom", work / "profile-probe")
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', done.stdout, flags=re.S)
    return json.loads(html.unescape(match.group(1))) if match else {}


def screenshot(page: Path, png: Path) -> str | None:
    """The whole page as a PNG drawn by headless Chromium offline, its height measured first.
    Returns None when done, else why not (no Chromium, or it drew nothing)."""
    browser = chromium()
    if browser is None:
        return "Chromium is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        try:
            found = probe(browser, page, tmp)
            height = min(max(int(found.get("page_height_px") or 0), 400), MAX_HEIGHT)
            shot = tmp / "shot.png"
            done = _settled(browser, page.resolve().as_uri(), height, f"--screenshot={shot}", tmp / "profile-shot")
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"Chromium failed ({exc})"
        if not found or not shot.is_file() or shot.stat().st_size == 0:
            return f"Chromium drew nothing (exit {done.returncode if found else 'probe'})"
        with atomic_path(png) as target:
            shutil.copyfile(shot, target)
    return None
