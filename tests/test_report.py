"""`slotq report --html`: the timeline page, rendered in a real headless
browser (Debian's chromium, driven by its own command line)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import one_line, slotq_cmd
from slotq import history
from slotq.history import report

# Dispatched into a copy of the page: hovering the first bar must show its
# details; the tooltip's text is copied where --dump-dom shows it.
HOVER = """<script>
var bar = document.querySelector("rect.run"), box = bar.getBoundingClientRect();
bar.dispatchEvent(new MouseEvent("mousemove", {bubbles: true, clientX: box.x + 1, clientY: box.y + 1}));
document.body.setAttribute("data-tip", document.getElementById("tip").textContent);
</script>"""


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed (scripts/test installs it as root)")
    return path


def browse(page: Path, tmp_path: Path, *args: str) -> tuple[str, str]:
    """(the DOM after the page's scripts ran, chromium's log)."""
    home = tmp_path / "chromium-home"
    home.mkdir(exist_ok=True)
    proc = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={home / 'profile'}", "--enable-logging=stderr", "--v=0",
                           "--window-size=1300,800", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=90, env=dict(os.environ, HOME=str(home)),
                          stdin=subprocess.DEVNULL)
    return proc.stdout, proc.stderr


def console_lines(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if ":CONSOLE" in ln]


def seed(state_dir: Path, n: int) -> float:
    """n finished runs on two slots (a third of them failed), plus one
    cancelled while it waited; returns the first submission time."""
    state_dir.mkdir()
    now = time.time()
    first = now - n * 4 - 60
    for i in range(n):
        sub = first + i * 4
        got = sub + (i % 5)
        history.append(str(state_dir), history.run_record(
            run_id=f"run{i:05d}", label=f"pytest part {i}", cls="shared", host="h", pool="shared",
            slot=f"shared#{i % 2}", outcome="failed" if i % 3 == 0 else "passed", exit_code=1 if i % 3 == 0 else 0,
            message="", phases={"submitted": sub, "slot": got, "started": got, "ended": got + 6},
            ticket=None, budget=None, kept=None))
    history.append(str(state_dir), history.run_record(
        run_id="gaveup", label="gave up", cls="shared", host="h", pool="shared", outcome="cancelled",
        exit_code=None, message="", phases={"submitted": now - 50, "ended": now - 20},
        slot=None, ticket=None, budget=None, kept=None))
    return first


@pytest.mark.timeout(120)
def test_the_page_renders_in_a_real_browser_one_bar_per_run_hover_and_no_console_errors(
        state_dir: Path, tmp_path: Path) -> None:
    seed(state_dir, 300)
    page = tmp_path / "runs.html"
    proc = subprocess.run(slotq_cmd() + ["report", "--html", str(page), "--since", "2h"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # One line says what was written: the file, how many runs, the window.
    assert re.fullmatch(rf"slotq report: wrote {re.escape(str(page))}: 301 run\(s\) from "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d to \d{4}-\d\d-\d\d \d\d:\d\d\n", proc.stderr), proc.stderr
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "the page must not need the network"
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", HOVER + "</body>"))
    dom, log = browse(probe, tmp_path, "--dump-dom")
    assert console_lines(log) == [], console_lines(log)
    assert 'data-ready="1"' in dom, "the page's script did not finish"
    assert len(re.findall(r'<rect class="run"', dom)) == 301
    assert len(re.findall(r'<rect class="wait"', dom)) == 301  # each run's wait is drawn, the cancelled one too
    tip = re.search(r'data-tip="([^"]*)"', dom)
    assert tip is not None
    assert "pytest part 0" in tip.group(1) and "failed (exit 1)" in tip.group(1) and "waited 0ms, ran 6.0s" in \
        tip.group(1), tip.group(1)
    # The summary per pool: p50/p95 wait, utilisation per slot, runs per outcome.
    assert re.search(r"<td>shared</td><td>301</td><td>2\.0s</td><td>4\.0s</td><td>shared#0 \d+%, shared#1 \d+%"
                     r"</td><td>cancelled 1, failed 100, passed 200</td>", text), text[:3000]
    shot = tmp_path / "report.png"
    browse(page, tmp_path, f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    artifacts = os.environ.get("SLOTQ_TEST_ARTIFACTS")
    if artifacts:  # for the test report
        shutil.copy(shot, Path(artifacts) / "report.png")


HOSTILE_LABELS = ["<!--<script>", "</script><script>document.title='taken'</script>",
                  "<img src=x onerror=\"document.title='taken'\">"]


@pytest.mark.timeout(120)
def test_labels_and_pools_anyone_could_write_neither_break_the_page_nor_run(state_dir: Path, tmp_path: Path) -> None:
    # In a shared state dir every user's run labels are on the page.
    state_dir.mkdir()
    now = time.time()
    for i, label in enumerate(HOSTILE_LABELS + ["plain"]):
        got = now - 100 + i * 10
        pool = '<em id="forged">pool</em>' if label == "plain" else "shared"  # a history line anyone can append
        history.append(str(state_dir), history.run_record(
            run_id=f"run{i}", label=label, cls="shared", host="h", pool=pool, slot="shared#0",
            outcome="passed", exit_code=0, message="", phases={"submitted": got - 1, "slot": got, "started": got,
                                                                 "ended": got + 5},
                                                                 ticket=None, budget=None, kept=None))
    page = tmp_path / "runs.html"
    proc = subprocess.run(slotq_cmd() + ["report", "--html", str(page), "--since", "1h"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, one_line(proc)
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", HOVER + "</body>"))  # the first run's tooltip
    dom, log = browse(probe, tmp_path, "--dump-dom")
    assert console_lines(log) == [], console_lines(log)
    assert 'data-ready="1"' in dom, "the page's script did not run to its end"
    assert len(re.findall(r'<rect class="run"', dom)) == len(HOSTILE_LABELS) + 1
    assert "<title>taken</title>" not in dom, "a label ran as code"
    assert '<em id="forged">' not in dom and '&lt;em id="forged"&gt;pool&lt;/em&gt;' in dom, "a pool name became markup"
    tip = re.search(r'data-tip="([^"]*)"', dom)
    assert tip is not None and tip.group(1).startswith("&lt;!--&lt;script&gt;"), tip


@pytest.mark.timeout(120)
def test_the_console_check_sees_an_error_in_a_broken_page(tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>notDefined();</script></body></html>")
    _, log = browse(broken, tmp_path, "--dump-dom")
    assert any("notDefined" in ln for ln in console_lines(log)), log[-2000:]


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit, non-interlaced PNG,
    as chromium writes its screenshots (the standard library has no PNG
    reader; this is the format's five row filters, nothing more)."""
    import struct
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        header, idat = (body, idat) if kind == b"IHDR" else (header, idat + body if kind == b"IDAT" else idat)
        pos += 12 + size
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw, stride, prev = zlib.decompress(idat), width * bpp, bytearray(width * bpp)
    rows: list[bytes] = []
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    if bpp == 4:  # RGB only
        rows = [b"".join(r[i:i + 3] for i in range(0, stride, 4)) for r in rows]
    return width, height, rows


@pytest.mark.timeout(180)
def test_a_busy_slots_lane_is_a_band_of_its_runs_colour_not_white(tmp_path: Path) -> None:
    # A day of 15 s runs back to back: each bar is a fraction of a pixel
    # wide, drawn 2 px wide. Their white outlines (which part bars of a few
    # pixels or more) painted over one another and left the lane white.
    now = time.time()
    runs = [{"run_id": f"r{i}", "user": "ci", "label": "pytest", "class": "shared", "pool": "shared",
             "slot": "shared#0", "outcome": "passed", "exit_code": 0, "waited_s": 1.0, "ran_s": 15.0,
             "phases": {"submitted": now - 86400 + i * 16, "slot": now - 86400 + i * 16 + 1, "prepared": None,
                        "started": now - 86400 + i * 16 + 1, "ended": now - 86400 + i * 16 + 16}}
            for i in range(5000)]
    page = tmp_path / "busy.html"
    page.write_text(report.render_html(report.build(runs, now - 86400, now, "vm")))
    shot = tmp_path / "busy.png"
    browse(page, tmp_path, f"--screenshot={shot}")
    width, _, rows = png_pixels(shot.read_bytes())
    green = sum(1 for row in rows for i in range(0, len(row), 3)
                if abs(row[i] - 0x2e) + abs(row[i + 1] - 0x7d) + abs(row[i + 2] - 0x32) < 60)
    # The lane is 1100 px long and 17 px high: most of it is the runs' green
    # (the legend's swatch is 100 pixels).
    assert green > 0.8 * 1100 * 17, green


@pytest.mark.timeout(120)
def test_a_line_that_changes_within_a_pixel_is_drawn_at_its_peaks_not_as_a_band(tmp_path: Path) -> None:
    # A day in which one run waits a second every 16 s (about five waits in
    # each pixel of the axis), and three wait at once near its middle. The
    # line of waiting runs went up and down within every pixel: a solid
    # blue band from 0 to 1 across the whole chart, the peak lost in it.
    now = time.time()

    def run(i: int, sub: float, waited: float) -> dict[str, object]:
        return {"run_id": f"r{i}", "user": "ci", "label": "pytest", "class": "shared", "pool": "shared",
                "slot": "shared#0", "outcome": "passed", "exit_code": 0, "waited_s": waited, "ran_s": 10.0,
                "phases": {"submitted": sub, "slot": sub + waited, "prepared": None, "started": sub + waited,
                           "ended": sub + waited + 10}}

    runs = [run(i, now - 86400 + i * 16, 1.0) for i in range(5000)]
    runs += [run(5000 + k, now - 43200 + k, 600.0) for k in range(2)]  # with the one due then: three at once
    page = tmp_path / "line.html"
    page.write_text(report.render_html(report.build(runs, now - 86400, now, "vm")))
    shot = tmp_path / "line.png"
    browse(page, tmp_path, f"--screenshot={shot}")
    _, _, rows = png_pixels(shot.read_bytes())
    blue = [(y, i // 3) for y, row in enumerate(rows) for i in range(0, len(row), 3)
            if abs(row[i] - 0x15) + abs(row[i + 1] - 0x65) + abs(row[i + 2] - 0xc0) < 60]
    # The chart is 1100 px wide and the line's area 80 px high (3 at the
    # top, 1 a third of the way up): the band was 1100 x 27 pixels (about
    # 28,000); a line at each pixel's peak is a pixel or two per column,
    # and still reaches up to the three.
    assert 1000 < len(blue) < 8000, len(blue)
    ys = [y for y, _ in blue]
    assert max(ys) - min(ys) >= 50, (min(ys), max(ys))


@pytest.mark.timeout(120)
def test_the_time_axis_of_more_than_half_a_day_gives_dates(tmp_path: Path) -> None:
    now = time.time()

    def run(at: float) -> dict[str, object]:
        return {"run_id": f"r{at}", "user": "ci", "label": "pytest", "class": "shared", "pool": "shared",
                "slot": "shared#0", "outcome": "passed", "exit_code": 0, "waited_s": 1.0, "ran_s": 15.0,
                "phases": {"submitted": at, "slot": at + 1, "prepared": None, "started": at + 1, "ended": at + 16}}

    ticks = {}
    for days in (0.1, 1, 7, 30):  # runs from the window's start to its end: the axis spans it all
        runs = [run(now - days * 86400 + 100), run(now - 100)]
        page = tmp_path / f"{days}d.html"
        page.write_text(report.render_html(report.build(runs, now - days * 86400, now, "vm")))
        dom, _ = browse(page, tmp_path, "--dump-dom")
        ticks[days] = re.findall(r'<text x="[^"]*" y="14" text-anchor="middle">([^<]*)</text>', dom)
        assert len(ticks[days]) == 11 and len(set(ticks[days])) == 11, ticks  # each tick its own moment
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks[0.1]), ticks[0.1]
    for days in (1, 7, 30):  # past half a day: the day too, as the page's title gives it
        assert all(re.fullmatch(r"\d\d-\d\d \d\d:\d\d", t) for t in ticks[days]), ticks[days]


@pytest.mark.timeout(180)
def test_ten_thousand_runs_make_a_few_hundred_kb_and_all_their_bars(tmp_path: Path) -> None:
    now = time.time()
    runs: list[dict[str, object]] = []
    for i in range(10_000):
        end = now - (10_000 - i) * 30
        runs.append({"run_id": f"r{i}", "user": ("alice", "bob", "ci")[i % 3], "label": f"pytest -q tests/part{i % 50}",
                     "class": "shared", "pool": "shared", "slot": f"shared#{i % 2}",
                     "outcome": ("passed", "failed", "exec_timeout")[i % 3], "exit_code": i % 3,
                     "waited_s": 20.0, "ran_s": 25.0,
                     "phases": {"submitted": end - 45, "slot": end - 25, "prepared": None, "started": end - 25,
                                "ended": end}})
    page = tmp_path / "big.html"
    page.write_text(report.render_html(report.build(runs, now - 7 * 86400, now, "vm")))
    assert page.stat().st_size < 600_000, page.stat().st_size
    dom, log = browse(page, tmp_path, "--dump-dom")
    assert console_lines(log) == [] and 'data-ready="1"' in dom
    assert len(re.findall(r'<rect class="run"', dom)) == 10_000


def test_the_queue_line_counts_the_runs_waiting_at_each_moment() -> None:
    def run(sub: float, got: float | None, end: float) -> dict[str, object]:
        return {"run_id": None, "pool": "p", "slot": "p#0" if got else None, "outcome": "passed",
                "waited_s": None, "phases": {"submitted": sub, "slot": got, "started": got, "ended": end}}

    data = report.build([run(100, 110, 120), run(105, 120, 130), run(106, None, 115)], 0, 1000, "h")
    since = float(data["since"])  # type: ignore[arg-type]
    steps = [(round(t / 10 + since), n) for t, n in data["queue"]]  # type: ignore[attr-defined]
    assert steps == [(100, 1), (105, 2), (106, 3), (110, 2), (115, 1), (120, 0)]


@pytest.mark.timeout(30)
def test_slurm_jobs_share_their_nodes_lanes_as_few_as_ran_at_once() -> None:
    # A Slurm job's slot is its allocation (`slurm job N`): the page had a
    # lane per job, 1,000 jobs a thousand lanes, each "utilised" by one run.
    def job(i: int, node: str, start: float, end: float) -> dict[str, object]:
        return {"run_id": f"r{i}", "pool": "shared", "slot": f"slurm job {i}", "host": node, "outcome": "passed",
                "waited_s": 1.0, "phases": {"submitted": start - 1, "slot": start, "started": start, "ended": end}}

    # On n1 two at a time (each 10 s, a new one every 5 s), on n2 one at a time.
    runs = [job(i, "n1", 1000 + 5 * i, 1010 + 5 * i) for i in range(500)]
    runs += [job(500 + i, "n2", 1000 + 10 * i, 1009 + 10 * i) for i in range(500)]
    runs.append({"run_id": "gone", "pool": "shared", "slot": None, "host": "slurm", "outcome": "cancelled",
                 "waited_s": 3.0, "phases": {"submitted": 1000, "ended": 1003}})
    runs.sort(key=lambda r: float(r["phases"]["ended"]))  # type: ignore[index]
    data: dict[str, Any] = report.build(runs, 0, 10_000, "h")
    assert sorted(data["lanes"]) == ["n1 (Slurm) #0", "n1 (Slurm) #1", "n2 (Slurm) #0", "shared (no slot)"]
    [pool] = data["summary"]
    assert all(0 < u <= 1 for u in pool["utilisation"].values()), pool
    # No two runs overlap in one lane (a row: submitted, then steps to slot, start and end; its lane).
    rows: list[list[int]] = [row for row in data["runs"] if row[1] is not None]
    spans = sorted((row[0] + row[1] + row[2], row[0] + row[1] + row[2] + row[3], row[4]) for row in rows)
    ends: dict[int, int] = {}
    for start, end, lane in spans:
        assert ends.get(lane, -1) <= start, (start, end, lane, ends)
        ends[lane] = end
    assert len(spans) == 1000


def test_a_page_of_several_hosts_keeps_their_slurm_jobs_in_node_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each host's slots were prefixed with its name (`a:shared#0`), Slurm
    # jobs' too (`a:slurm job 7`): a lane per job again.
    from slotq.cli import history as cli_history, report as cli_report
    from slotq.cli.args import Namespace

    def job(i: int, host: str) -> dict[str, object]:
        return {"run_id": f"r{i}", "pool": "shared", "class": "shared", "slot": f"slurm job {i}", "host": host,
                "outcome": "passed", "waited_s": 1.0,
                "phases": {"submitted": 99.0 + i, "slot": 100.0 + i, "started": 100.0 + i, "ended": 100.5 + i}}

    fake = [("a", [job(1, "a"), job(2, "a")]), ("b", [job(3, "b")])]
    monkeypatch.setattr(cli_history, "remote_runs", lambda opts, filters: (fake, []))
    runs, unreachable = cli_report._remote(Namespace({"host": "a,b"}), 0.0, 1000.0)
    data = report.build(runs, 0, 1000, "a, b")
    assert unreachable == [] and data["lanes"] == ["a (Slurm) #0", "b (Slurm) #0"], data["lanes"]
    assert [p["pool"] for p in data["summary"]] == ["a:shared", "b:shared"]  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_bad_report_arguments_are_one_line_exit_64(state_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(slotq_cmd() + ["report"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 64 and "--html" in one_line(proc)
    proc = subprocess.run(slotq_cmd() + ["report", "--html", str(tmp_path / "no" / "such" / "dir.html")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 64 and "cannot write --html file" in one_line(proc)
    proc = subprocess.run(slotq_cmd() + ["report", "--html", str(tmp_path / "x.html"), "--since", "1h",
                                         "--until", "2h"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 64 and "--until is not after --since" in one_line(proc)
    assert not (tmp_path / "x.html").exists() and not list(tmp_path.glob(".x.html*"))
    proc = subprocess.run(slotq_cmd() + ["report", "--html", str(tmp_path / "x.html"), "--slurm"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 64 and "a run through Slurm is in the history like any other" in one_line(proc)
