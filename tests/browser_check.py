"""Open one page in Debian's headless Chromium (selenium + chromium-driver) and report what a
person would see: the visible text, how many charts hold drawn pixels, the console's errors, every
URL the browser requested (Chrome's performance log, Network.requestWillBeSent), and whether a
JavaScript dialog opened (a ``<script>alert(1)</script>`` that ran).

Run as a script so a test can start it inside a lab namespace (the daemon listens there):
``python tests/browser_check.py URL[::SCREENSHOT.png]...`` prints a JSON list, one entry per page
(one browser visits them in turn).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage")

LOCAL_SCHEMES = ("chrome:", "chrome-untrusted:", "devtools:", "about:", "data:", "blob:")
# Counts, per div.chart, the canvas pixels that are neither transparent nor near-white, looking
# into shadow roots (BokehJS draws inside them).
DRAWN_PIXELS = """
function canvases(root) {
  const out = [];
  for (const el of root.querySelectorAll('*')) {
    if (el.tagName === 'CANVAS') { out.push(el); }
    if (el.shadowRoot) { out.push(...canvases(el.shadowRoot)); }
  }
  return out;
}
return [...document.querySelectorAll('div.chart')].map((chart) => {
  let best = 0;
  for (const cv of canvases(chart)) {
    if (!cv.width || !cv.height) { continue; }
    const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] > 0 && !(d[i] > 240 && d[i + 1] > 240 && d[i + 2] > 240)) { n++; }
    }
    best = Math.max(best, n);
  }
  return best;
});
"""


def available() -> str | None:
    """Why a browser test cannot run here (None: it can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the test extra)"
    for path in (CHROMIUM, DRIVER):
        if not Path(path).exists():
            return f"{path} is missing (Debian chromium and chromium-driver, .ci/apt-packages)"
    return None


def _visit(driver, url: str, screenshot: str | None, timeout_s: float) -> dict:
    from selenium.common.exceptions import NoAlertPresentException

    driver.get_log("browser"), driver.get_log("performance")   # drop the previous page's
    t0 = time.monotonic()
    driver.set_window_size(1280, 1500)
    driver.get(url)
    pixels: list[int] = []
    while time.monotonic() - t0 < timeout_s:
        pixels = driver.execute_script(DRAWN_PIXELS)
        drawn = driver.execute_script("return document.body.getAttribute('data-charts')")
        if drawn is not None and pixels and all(n > 0 for n in pixels):
            break
        time.sleep(0.25)
    try:
        alert = driver.switch_to.alert.text
    except NoAlertPresentException:
        alert = None
    text = driver.find_element("tag name", "body").text
    if screenshot:
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1280, min(max(height + 40, 600), 3000))
        driver.save_screenshot(screenshot)
    requests = []   # what went out of the browser: not its own chrome:// pages, not data:
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            url_sent = msg["params"]["request"]["url"]
            if not url_sent.startswith(LOCAL_SCHEMES):
                requests.append(url_sent[:200])
    return {"url": url, "title": driver.title, "text": text, "charts": len(pixels),
            "drawn_pixels": pixels, "charts_attr": driver.execute_script(
                "return document.body.getAttribute('data-charts')"),
            "console": driver.get_log("browser"), "requests": requests, "alert": alert,
            "seconds": round(time.monotonic() - t0, 2)}


def check(pages: list[tuple[str, str | None]], timeout_s: float = 30.0) -> list[dict]:
    """Visit each (url, screenshot path or None) in one fresh browser profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="wanprobe-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
    try:
        return [_visit(driver, url, shot, timeout_s) for url, shot in pages]
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("pages", nargs="+", metavar="URL[::SCREENSHOT.png]")
    args = ap.parse_args()
    pages = [(u, shot or None) if u else (shot, None) for u, _, shot in (p.rpartition("::") for p in args.pages)]
    print(json.dumps(check(pages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
