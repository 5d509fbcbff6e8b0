"""report.html in a real browser (Debian's chromium, headless): every image loads, every table
renders, and the first screen (1280×800) shows the Findings table.

Skipped with a reason where no chromium is installed; under CI (CI=true or MARIN_REQUIRE_BROWSER=1)
the same condition FAILS, so a missing browser cannot pass as a skip (.ci/run installs it with apt).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from marin_ablate.analysis.calibration.simulate import random_truth, simulate_table, write_study
from marin_ablate.analysis.io.results import collect
from marin_ablate.analysis.pipeline import analyze_table
from marin_ablate.analysis.report.html import render_html
from marin_ablate.analysis.report.writer import write_report
from marin_ablate.cli.main import main

BROWSER_REQUIRED = os.environ.get("CI", "").lower() == "true" or os.environ.get("MARIN_REQUIRE_BROWSER") == "1"
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
VIEWPORT = (1280, 800)

# Runs once the page and its images have loaded; writes what it measured into a data attribute,
# which --dump-dom then prints (the DOM after scripts ran).
PROBE = """<script>
window.addEventListener("load", () => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.top + scrollY, r.bottom + scrollY, r.width]; };
  const h2 = [...document.querySelectorAll("h2")].find(h => h.textContent.trim() === "Findings");
  let t = h2 && h2.nextElementSibling;
  while (t && t.tagName !== "TABLE") t = t.nextElementSibling;
  document.body.dataset.probe = JSON.stringify({
    viewport: [innerWidth, innerHeight],
    images: [...document.images].map(i => ({src: i.getAttribute("src"), complete: i.complete, w: i.naturalWidth,
                                           h: i.naturalHeight})),
    tables: [...document.querySelectorAll("table")].map(x => ({rows: x.rows.length, cols: x.rows[0].cells.length,
                                                               box: box(x)})),
    findings: t ? {box: box(t), rows: t.rows.length, first_row: box(t.rows[1]), text: t.rows[0].textContent} : null,
  });
});
</script>"""


@pytest.fixture(scope="module")
def browser() -> str:
    if BROWSER is None:
        why = "no chromium on PATH (Debian: apt-get install -y chromium)"
        if BROWSER_REQUIRED:
            pytest.fail(f"the browser test is required here (CI / MARIN_REQUIRE_BROWSER) but: {why}", pytrace=False)
        pytest.skip(why)
    return BROWSER


def _chromium(browser: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={tmp / 'profile'}", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
                           "--allow-file-access-from-files", "--virtual-time-budget=10000", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_report_html_in_headless_chromium(tmp_path, browser):
    rng = np.random.default_rng(0)
    factors = ["xsa", "sconv", "ep_transport"]
    df = simulate_table(random_truth(factors, rng), rungs={"r0": 1e8, "r1": 4e8, "r2": 1.6e9}, seeds=2, rng=rng,
                        loss_curves=True)
    t = collect(write_study(df, tmp_path / "study"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        a = analyze_table(t, n_boot=0, boot_method="none", replicates=False, law_forms=("power",))
    _, html = write_report(a, t, tmp_path / "report", title="tiny")
    n_img = len(re.findall(r"<img ", html.read_text()))
    n_tab = len(re.findall(r"<table>", html.read_text()))
    assert n_img >= 6 and n_tab >= 6
    probe = html.with_name("probe.html")  # beside report.html: the same relative image paths
    # the report's policy forbids every script; the probe's copy lets its own inline one run and keeps the
    # rest of the policy (images from the report's folder), so the images below load under it
    page = html.read_text()
    assert "script-src 'none'" in page
    probe.write_text(page.replace("script-src 'none'", "script-src 'unsafe-inline'")
                     .replace("</body>", PROBE + "</body>"))

    r = _chromium(browser, tmp_path, "--dump-dom", probe.as_uri())
    m = re.search(r'data-probe="([^"]*)"', r.stdout)
    assert m, f"the page's script did not run: rc={r.returncode} {r.stderr[-2000:]}"
    import html as html_lib

    got = json.loads(html_lib.unescape(m.group(1)))
    width, height = got["viewport"]  # a 1280×800 window; headless chromium may keep some of it for its frame
    assert width == VIEWPORT[0] and 500 < height <= VIEWPORT[1], got["viewport"]
    assert len(got["images"]) == n_img
    for im in got["images"]:
        assert im["complete"] and im["w"] > 100 and im["h"] > 100, im  # decoded: the file loaded
    assert len(got["tables"]) == n_tab
    for tab in got["tables"]:
        top, bottom, width = tab["box"]
        assert tab["rows"] >= 2 and tab["cols"] >= 2 and bottom - top > 20 and width > 50, tab
    f = got["findings"]
    assert f is not None and "component" in f["text"] and "qualifiers" in f["text"]
    assert f["rows"] == len(factors) + 2  # header, one row per component, TOTAL
    assert f["box"][0] < height and f["first_row"][1] <= height, f  # on the first screen

    shot = tmp_path / "first_screen.png"
    r = _chromium(browser, tmp_path, f"--screenshot={shot}", html.as_uri())
    assert shot.exists(), r.stderr[-2000:]
    import matplotlib.image

    img = matplotlib.image.imread(shot)
    assert img.shape[:2] == (VIEWPORT[1], VIEWPORT[0]) and img[..., :3].std() > 0.05  # a rendered page, not blank


# What an imported table can carry in every name it gives: arm, factor (a column), level, rung, source.
SCRIPT = "<script>document.title='PWNED';document.documentElement.dataset.pwned='script'</script>"
ONERROR = "<img src=x onerror=\"document.title='PWNED';document.documentElement.dataset.pwned='img'\">"


def _hostile_csv(path: Path) -> Path:
    import itertools
    import math

    import pandas as pd

    f1, f2 = "f" + SCRIPT, "g" + ONERROR
    rows = []
    for rung, c in (("r" + ONERROR, 1e17), ("r" + SCRIPT, 4e17)):
        for a, b in itertools.product((0, 1), repeat=2):
            for seed in (0, 1):
                rows.append({"arm": ["base", "+" + SCRIPT, "+" + ONERROR, "both" + SCRIPT][2 * a + b], "rung": rung,
                             "seed": seed, f1: ["off", "on" + ONERROR][a], f2: ["off", "on" + SCRIPT][b],
                             "loss": 2 + 400 * c ** -0.2 * math.exp(-0.02 * a - 0.03 * b) * (1 + 0.001 * seed),
                             "flops": c, "tokens": 1e9, "tokens_per_s": 1e5 * (1 + 0.1 * a), "source": SCRIPT})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _ran(browser: str, tmp: Path, page: Path) -> tuple[str, str | None]:
    """(document.title, the marker a hostile script writes) after the page loaded and its scripts ran."""
    r = _chromium(browser, tmp, "--dump-dom", page.as_uri())
    assert "<body" in r.stdout, f"chromium printed no DOM: rc={r.returncode} {r.stderr[-2000:]}"
    title = re.search(r"<title>(.*?)</title>", r.stdout, re.S)
    mark = re.search(r'data-pwned="([^"]*)"', r.stdout)
    return (title.group(1) if title else ""), (mark.group(1) if mark else None)


@pytest.mark.slow
def test_report_from_hostile_imported_names_runs_no_script(tmp_path, browser):
    """Arm, factor, level, rung and source names holding `<script>` and `<img onerror>` reach report.html as
    text: the page shows them, and no script runs (the report's policy forbids scripts besides)."""
    src = _hostile_csv(tmp_path / "hostile.csv")
    assert main(["analyze", "--import.table", str(src), "--study-dir", str(tmp_path / "study")]) == 0
    assert main(["analyze", str(tmp_path / "study"), "--report-dir", str(tmp_path / "rep"), "--n-boot", "0"]) == 0
    page = tmp_path / "rep" / "report.html"
    text = page.read_text()
    assert "<script" not in text and "<img src=x" not in text
    assert "&lt;script&gt;document.title" in text  # the names are shown, escaped
    assert _ran(browser, tmp_path, page) == ("hostile", None)  # the study is named after the file

    # the same Markdown rendered without escaping or policy: the hostile names do run, so the check above can fail
    import markdown

    md = (tmp_path / "rep" / "report.md").read_text()
    bare = page.with_name("unescaped.html")
    bare.write_text("<!doctype html><html><head><title>study</title></head><body>" + markdown.markdown(
        md, extensions=["tables"]) + "</body></html>")
    assert _ran(browser, tmp_path, bare)[0] == "PWNED"
    # and escaping alone or the policy alone each stop it: the policy holds for raw HTML that gets through
    raw = page.with_name("policy_only.html")
    raw.write_text(render_html("x", "study").replace("<p>x</p>", SCRIPT + ONERROR))
    assert _ran(browser, tmp_path, raw) == ("study", None)
