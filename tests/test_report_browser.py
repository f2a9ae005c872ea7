"""The report as a user sees it: opened in headless Chromium (Debian's ``chromium``).

The page's own load handler writes whether every image decoded (non-zero natural size)
into ``<body data-images-ok>``, so ``--dump-dom`` shows it; console messages (uncaught
errors included) come out on stderr with ``--enable-logging=stderr``. Skipped where
chromium is absent, except under CI=true, where ``.ci/run`` installs it.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
from html.parser import HTMLParser

import pytest
from conftest import IN_CI
from report_cases import four_gpu_plan, four_gpu_run, hand_plan, run_record, synthetic_plan

from placer.report.doc import as_plan
from placer.report.html import write_report

pytestmark = pytest.mark.browser

SECTION_IDS = {"summary", "placement", "costs", "timeline", "memory", "links", "ops", "measured"}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000", "--enable-logging=stderr", "--v=0"]


def chromium() -> str:
    for name in ("chromium", "/usr/bin/chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if IN_CI:
        pytest.fail("CI=true but chromium is not installed (.ci/run installs it with apt-get)")
    pytest.skip("headless chromium not found: apt-get install chromium")


def browse(page, tmp_path, *args) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    cmd = [chromium(), *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(tmp_path)})


class Dom(HTMLParser):
    def __init__(self, text):
        super().__init__()
        self.sections, self.op_rows, self.body = set(), 0, {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.add(a.get("id"))
        elif tag == "body":
            self.body = a
        elif tag == "tr" and "op-row" in (a.get("class") or "").split():
            self.op_rows += 1


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    small, big, gpus4 = hand_plan(), synthetic_plan(300), four_gpu_plan()
    write_report(as_plan(small), run_record(small, emulated=True), out / "small.html")
    write_report(as_plan(big), run_record(big, emulated=False), out / "big.html")
    write_report(as_plan(gpus4), four_gpu_run(gpus4), out / "gpus4.html")
    return {"small": (out / "small.html", small), "big": (out / "big.html", big),
            "gpus4": (out / "gpus4.html", gpus4)}


@pytest.mark.parametrize("which", ["small", "big", "gpus4"])
def test_dom_has_every_section_row_and_decoded_image(pages, which, tmp_path):
    page, plan = pages[which]
    res = browse(page, tmp_path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    dom = Dom(res.stdout)
    assert SECTION_IDS <= dom.sections
    assert dom.op_rows == len(plan["ops"])
    assert dom.body.get("data-images") == "7"   # baselines, graph, costs, timeline, memory, links, scatter
    assert dom.body.get("data-images-ok") == "yes"
    assert console_lines(res.stderr) == []


def test_screenshot_is_a_full_page_png(pages, tmp_path):
    page, _ = pages["big"]
    shot = tmp_path / "shot.png"
    res = browse(page, tmp_path, f"--screenshot={shot}", "--window-size=1400,3000")
    assert res.returncode == 0, res.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1400, 3000)
    assert len(data) > 100_000      # a blank page compresses to a few kilobytes
    assert console_lines(res.stderr) == []


def test_checks_see_a_script_error_and_an_image_that_does_not_decode(pages, tmp_path):
    page, _ = pages["small"]
    text = page.read_text()
    start = text.index("data:image/svg+xml;base64,") + len("data:image/svg+xml;base64,")
    text = text[:start] + "bm90IGFuIGltYWdl" + text[text.index('"', start):]
    broken = tmp_path / "broken.html"
    broken.write_text(text.replace("</body>", "<script>notDefined();</script></body>"))
    res = browse(broken, tmp_path, "--dump-dom")
    assert Dom(res.stdout).body.get("data-images-ok", "").startswith("no: Plan vs baselines")
    assert any("Uncaught ReferenceError" in line for line in console_lines(res.stderr))


SORT_PROBE = """<script>
window.addEventListener("load", function () {
  var th = document.querySelectorAll("#op-table th")[4];   // CPU time
  var col = function () { return Array.prototype.map.call(document.querySelectorAll("#op-table tbody tr"),
      function (r) { return parseFloat(r.cells[4].dataset.v); }); };
  th.click(); var up = col(); th.click(); var down = col();
  var sorted = function (a, s) { return a.every(function (v, i) { return i === 0 || s * (v - a[i - 1]) >= 0; }); };
  document.body.setAttribute("data-sort-probe", [up.length, sorted(up, 1), sorted(down, -1)].join(","));
});
</script></body>"""


def test_clicking_a_heading_sorts_the_op_table(pages, tmp_path):
    page, plan = pages["big"]
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", SORT_PROBE))
    res = browse(probe, tmp_path, "--dump-dom")
    assert Dom(res.stdout).body.get("data-sort-probe") == f"{len(plan['ops'])},true,true"
    assert console_lines(res.stderr) == []
