"""Issue 14: what a user sees -- the live line on a terminal, ETAs, the
command's slot environment, and the edges a new user hit."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import unicodedata
from pathlib import Path
from typing import Callable

import pytest

from conftest import Start, live_tickets, slot_held_here, slotq_cmd, start_holder, wait_for, watch_snapshots
from slotq import history



def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env=env, cwd=cwd)


def read_pty(fd: int, proc: subprocess.Popen[bytes], until: Callable[[bytes], bool] | None = None,
             timeout: float = 30) -> bytes:
    """What is written to a pty: until `until(all so far)` holds, or (by
    default) until its writer ends."""
    out = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end and not (until is not None and until(out)):
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            out += data
        elif until is None and proc.poll() is not None:
            break
    return out


def watch_on_a_terminal(frames: int, columns: int | None = None, env: dict[str, str] | None = None,
                        until: Callable[[bytes], bool] = lambda b: True) -> bytes:
    """`slotq status --watch` on a terminal (`columns` wide if given) until
    it has drawn `frames` frames and `until` holds, then Ctrl-C: all it
    wrote. It must exit 0."""
    master, slave = pty.openpty()
    if columns is not None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(slotq_cmd() + ["status", "--watch", "--every", "0.2"], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=env or dict(os.environ, TERM="xterm"))
    os.close(slave)
    seen = read_pty(master, proc, until=lambda b: b.count(b"\x1b[H") >= frames and until(b), timeout=20)
    proc.send_signal(signal.SIGINT)
    seen += read_pty(master, proc)
    os.close(master)
    assert proc.wait(timeout=10) == 0
    return seen


def cells(text: str) -> int:
    """Terminal cells: two for a wide character."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


@pytest.mark.timeout(60)
def test_on_a_terminal_the_waiting_line_is_redrawn_in_place_and_replaced_by_the_slot_line(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    master, slave = pty.openpty()
    proc = subprocess.Popen(slotq_cmd() + ["run", "--", "echo", "hi"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env=dict(os.environ, TERM="xterm"))
    os.close(slave)
    # Two redraws (about a second apart) before the slot is given.
    seen = read_pty(master, proc, until=lambda b: b.count(b"\r\x1b[2Kslotq: waiting") >= 2, timeout=20)
    gate.touch()
    seen += read_pty(master, proc)
    os.close(master)
    assert proc.wait(timeout=10) == 0 and holder.wait() == 0
    text = seen.decode()
    redraws = re.findall(r"\r\x1b\[2K(slotq: waiting [^\r\n]*)", text)
    assert len(redraws) >= 2, text
    assert "#1 in shared" in redraws[-1] and "placeholder" in redraws[-1], redraws
    assert "ETA ~" not in redraws[-1], "a new pool's typical run is not known: no estimate rather than a guess"
    assert "ETA ≤" in redraws[-1], "... but the holder's budget bounds the wait"
    # The slot line replaces the live one (erased first), then ordinary lines.
    assert re.search(r"\r\x1b\[2Kslotq: slot shared#0 acquired after", text), text
    assert "\n" not in text.split("slotq: slot shared#0")[0].replace("\r\n", "\n").rstrip("\n"), \
        "the waiting lines were not kept on one line"


@pytest.mark.timeout(60)
def test_in_a_pipe_the_waiting_lines_are_plain_with_an_eta_once_runs_are_known(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    waiter = runs("--report-every", "0.2", "--", "true", name="waiter")
    # A new pool (no run over yet): no estimate, but the holder's budget
    # bounds the wait, and the line says so -- briefly.
    wait_for(lambda: "expected wait at most" in waiter.err, what="a waiting line saying the bound")
    line = next(ln for ln in waiter.err.splitlines() if "expected wait" in ln)
    assert re.search(r"expected wait at most (59m\d\ds|1h00m) \(the holders' budgets left; typical run unknown "
                     r"until 5 runs of this pool, 0 so far\)", line), line
    assert len(line) < 250, line
    gate.touch()
    assert waiter.wait() == 0 and holder.wait() == 0
    from slotq import history

    now = time.time()
    for i in range(5):
        history.append(str(state_dir), history.run_record(
            run_id=f"seed{i}", label="seed", cls="shared", host="h", outcome="passed", exit_code=0, message="",
            pool="shared", phases={"submitted": now - 60, "slot": now - 60, "started": now - 60, "ended": now - 30},
            slot=None, ticket=None, budget=None, kept=None))
    gate.unlink()
    holder = start_holder(runs, state_dir, gate)
    waiter = runs("--report-every", "0.2", "--", "true", name="waiter2")
    wait_for(lambda: "expected wait ~" in waiter.err, what="a waiting line with an ETA")
    gate.touch()
    assert waiter.wait() == 0 and holder.wait() == 0
    assert "\x1b" not in waiter.err and "\r" not in waiter.err
    line = next(ln for ln in waiter.err.splitlines() if "expected wait ~" in ln)
    assert "(0 ahead, 1 of 1 slot(s) busy, typical run 30.0s (median of the pool's last" in line, line


@pytest.mark.timeout(90)
def test_the_eta_of_the_third_in_line_is_within_25_percent_when_run_times_are_known(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    run_s = 1.5
    state_dir.mkdir()
    now = time.time()
    for i in range(10):  # the pool's history: every run takes 1.5 s
        history.append(str(state_dir), history.run_record(
            run_id=f"old{i}", label="old", cls="shared", host="h", outcome="passed", exit_code=0, message="",
            pool="shared", phases={"submitted": now - 100, "slot": now - 100, "started": now - 100,
                                   "ended": now - 100 + run_s}, slot=None, ticket=None, budget=None, kept=None))
    gate = tmp_path / "gate"
    holder = runs("--", "sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.01; done; sleep {run_s}', name="h")
    wait_for(lambda: not live_tickets(state_dir) and json.loads(cli("status", "--json").stdout)["pools"][0]
             ["slots"][0]["held"], what="the holder holds the slot")
    ahead = [runs("--", "sleep", str(run_s), name=f"ahead{i}") for i in range(2)]
    wait_for(lambda: len(live_tickets(state_dir)) == 2, what="two in line")
    mine = runs("--", "true", name="mine")
    wait_for(lambda: len(live_tickets(state_dir)) == 3, what="three in line")
    gate.touch()  # the holder now runs for 1.5 s: its time left is known
    snap = json.loads(cli("status", "--json").stdout)
    t0 = time.time()
    pool = snap["pools"][0]
    eta = pool["waiting"][2]["eta"]
    assert eta["how"].startswith("2 ahead, 1 of 1 slot(s) busy, typical run 1.5s (median of the pool's last 10 run(s))")
    assert mine.wait() == 0 and holder.wait() == 0 and all(r.wait() == 0 for r in ahead)
    actual = mine.result()["phases"]["slot"] - t0
    assert abs(eta["s"] - actual) <= 0.25 * actual, (eta, actual)
    assert pool["eta"]["s"] >= eta["s"]  # a new run would wait at least as long


@pytest.mark.timeout(60)
def test_the_command_knows_its_slot(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    (tmp_path / "host.toml").write_text("[pools]\nshared = 2\nlanding = 1\n")
    env = dict(os.environ, SLOTQ_CONFIG=str(tmp_path / "host.toml"))
    show = ["sh", "-c", "env | grep ^SLOTQ_ | sort"]
    out = cli("run", "-q", "--budget", "90s", "--class", "landing", "--", *show, env=env).stdout
    got = dict(line.split("=", 1) for line in out.splitlines())
    assert got["SLOTQ_POOL"] == "landing" and got["SLOTQ_SLOT"] == "landing#0" and got["SLOTQ_SLOT_INDEX"] == "0"
    assert got["SLOTQ_BUDGET"] == "90" and re.fullmatch(r"[0-9a-f]{12}", got["SLOTQ_RUN_ID"])
    # Two at once in a two-slot pool: each its own index.
    gate = tmp_path / "gate"
    first = subprocess.Popen(slotq_cmd() + ["run", "-q", "--", "sh", "-c",
                                            f'echo $SLOTQ_SLOT; while [ ! -e "{gate}" ]; do sleep 0.01; done'],
                             env=env, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert first.stdout is not None
    slot_a = first.stdout.readline().strip()
    words = cli("run", "-q", "--", "sh", "-c", "echo $SLOTQ_SLOT $SLOTQ_SLOT_INDEX", env=env).stdout.split()
    gate.touch()
    first.wait(timeout=30)
    assert {slot_a, words[0]} == {"shared#0", "shared#1"} and words[1] == words[0][-1]


@pytest.mark.timeout(60)
def test_a_standby_started_command_knows_its_slot_too(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # In a one-slot line the next command is started by a keeper waiting
    # in flock(2): it gets the same variables.
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    nxt = runs("--", "sh", "-c", "echo $SLOTQ_POOL $SLOTQ_SLOT $SLOTQ_SLOT_INDEX", name="next")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="next in line")
    gate.touch()
    assert nxt.wait() == 0 and holder.wait() == 0
    assert nxt.out == b"shared shared#0 0\n"


@pytest.mark.timeout(30)
def test_json_to_stdout_starts_on_a_line_of_its_own(state_dir: Path) -> None:
    proc = cli("run", "-q", "--json", "-", "--", "printf", "abc")
    assert proc.stdout.startswith("abc\n{"), proc.stdout
    assert json.loads(proc.stdout[4:])["outcome"] == "passed"
    proc = cli("run", "-q", "--json", "-", "--", "echo", "abc")
    assert proc.stdout.startswith("abc\n{"), proc.stdout  # no blank line when the output ended one


@pytest.mark.timeout(30)
def test_json_to_stdout_is_one_compact_line_the_last(state_dir: Path, tmp_path: Path) -> None:
    # `tail -1 | jq` must read the record (issue 48: it was about 25 indented lines).
    for args in (["run", "-q", "--json", "-", "--", "printf", "a\\nb\\n"],
                 ["task", "--budget", "10s", "--json", "-", "--", "echo", "x"]):
        proc = cli(*args, cwd=tmp_path)
        *before, last = proc.stdout.splitlines()
        assert before == (["a", "b"] if args[0] == "run" else ["x"]), proc.stdout
        assert last.startswith("{") and json.loads(last)["exit_code"] == 0, last
        assert '": ' not in last and '", "' not in last, "compact"
    (tmp_path / "r.json").unlink(missing_ok=True)
    assert cli("run", "-q", "--json", str(tmp_path / "r.json"), "--", "true").returncode == 0
    assert (tmp_path / "r.json").read_text().count("\n") > 5, "a file keeps the indented record"


@pytest.mark.parametrize("args", [["status", "--json"], ["waits", "--json"], ["history", "--json"],
                                  ["run", "-q", "--json", "-", "--", "true"]])
@pytest.mark.timeout(30)
def test_a_reader_that_goes_away_is_a_quiet_exit(state_dir: Path, args: list[str]) -> None:
    cmd = " ".join(slotq_cmd() + args)
    proc = subprocess.run(["bash", "-c", f'{cmd} | head -c1 >/dev/null; echo "${{PIPESTATUS[0]}}"'],
                          capture_output=True, text=True, timeout=30)
    assert proc.stderr == "", proc.stderr
    assert proc.stdout.strip() in ("0", "141"), proc.stdout
    proc = subprocess.run(["bash", "-c", f"{cmd} | no-such-jq-here 2>/dev/null"], capture_output=True, text=True,
                          timeout=30)
    assert proc.stderr == "" and "Traceback" not in proc.stdout


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["waits"], ["history"], ["history", "--json"],
                                  ["--help"], ["--version"], ["run", "--help"], ["status", "--help"],
                                  ["completion", "bash"], ["report", "--html", "/dev/full"]])
@pytest.mark.timeout(30)
def test_output_that_cannot_be_written_is_one_line_and_exit_74(state_dir: Path, args: list[str]) -> None:
    # A full disk under `slotq status > out`: it was "error: No space left
    # on device" and exit 73, the code of an unusable state dir; `--help`
    # and `--version` were tracebacks, `report --html` exit 0.
    with open("/dev/full", "w") as full:
        proc = subprocess.run(slotq_cmd() + args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=30)
    assert proc.returncode == 74, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0], proc.stderr
    assert "/dev/full" in lines[0] if args[0] == "report" else "cannot write the output (stdout)" in lines[0]


@pytest.mark.parametrize("command, codes", [("status", ("73 ", "74 ", "78 ", "121 ")),
                                             ("history", ("73 ", "74 ", "78 ", "121 ")),
                                             ("report", ("73 ", "74 ", "78 ", "121 ")),
                                             ("waits", ("73 ", "74 ", "78 "))])
def test_the_help_of_every_command_that_shows_names_its_exit_codes(command: str, codes: tuple[str, ...]) -> None:
    # run, task and cancel listed theirs; status, history, waits and report none.
    text = cli(command, "--help").stdout
    tail = text[text.index("exit codes:"):]
    assert all(code in tail for code in codes), tail
    assert max(len(line) for line in tail.splitlines()) <= 80, tail


@pytest.mark.timeout(30)
def test_the_exec_timeout_message_does_not_restate_a_different_wait(state_dir: Path) -> None:
    proc = cli("run", "--budget", "0.3", "--kill-grace", "0.1", "--", "sleep", "5")
    assert proc.returncode == 124
    last = proc.stderr.splitlines()[-1]
    assert last.count("waited") == 1, last
    assert re.search(r"slot acquired at \d\d:\d\d:\d\d; the budget counted from the command's start at "
                     r"\d\d:\d\d:\d\d", last), last


@pytest.mark.timeout(30)
def test_status_says_how_long_the_holder_has_held_its_slot(state_dir: Path) -> None:
    from slotq.procinfo import start_ticks

    with slot_held_here(state_dir) as lease:
        lease.record(run_id="feedc0de", label="long suite", pid=os.getpid(), pid_start=start_ticks(os.getpid()),
                     since=time.time() - 125, budget=600.0, phase="running")
        proc = cli("status", "--json")
        assert proc.returncode == 0, proc.stderr
        [slot] = next(p for p in json.loads(proc.stdout)["pools"] if p["pool"] == "shared")["slots"]
        assert 125 <= slot["held_s"] < 185, slot
        text = cli("status").stdout
        assert re.search(r"shared#0: long suite .*running, held 2m\d\ds, budget 10m00s\)", text), text


@pytest.mark.timeout(30)
def test_a_label_the_terminal_cannot_encode_is_shown_as_a_question_mark_not_a_traceback(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Another user's label broke `status` and `history` (UnicodeEncodeError)
    # for anyone whose output encoding cannot show it.
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate, "--label", "ü-holder")
    ascii_env = dict(os.environ, PYTHONIOENCODING="ascii")
    proc = cli("status", env=ascii_env)
    assert proc.returncode == 0 and "shared#0: ?-holder (user " in proc.stdout, proc.stderr
    gate.touch()
    assert holder.wait() == 0
    proc = cli("history", env=ascii_env)
    assert proc.returncode == 0 and proc.stdout.splitlines()[1].endswith(" ?-holder"), proc.stderr


@pytest.mark.timeout(30)
def test_status_ends_with_a_newline_and_bare_slotq_is_usage_on_stderr(state_dir: Path) -> None:
    proc = cli("status")
    assert proc.returncode == 0 and proc.stdout.endswith("\n") and not proc.stdout.endswith("\n\n")
    proc = cli()
    assert (proc.returncode, proc.stdout) == (64, "") and proc.stderr.startswith("usage: slotq")
    proc = cli("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: slotq") and proc.stderr == ""


@pytest.mark.timeout(30)
def test_one_vocabulary_in_status_json_and_absolute_paths_in_task_json(state_dir: Path, runs: Start,
                                                                        tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    snap = json.loads(cli("status", "--json").stdout)
    gate.touch()
    assert holder.wait() == 0
    slot = snap["pools"][0]["slots"][0]
    assert slot["class"] == "shared" and "cls" not in slot
    snap = json.loads(cli("status", "--json").stdout)
    last = snap["history"][-1]
    assert last["class"] == "shared" and "cls" not in last
    assert tuple(last["phases"]) == ("submitted", "transferred", "slot", "prepared", "started", "ended")  # a record's
    proc = cli("task", "--budget", "10s", "--json", "-", "--", "true", cwd=tmp_path)
    res = json.loads(proc.stdout)
    assert os.path.isabs(res["credit_dir"]) and res["credit_dir"] == os.path.realpath(tmp_path), res


@pytest.mark.timeout(60)
def test_status_watch_in_a_pipe_prints_plain_snapshots_at_the_interval(state_dir: Path, runs: Start,
                                                                       tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    code, out = watch_snapshots(["--every", "0.2"], count=3)
    gate.touch()
    assert holder.wait() == 0
    assert code == 0, out
    snaps = [s for s in out.split("--- ")[1:] if s.strip()]
    assert len(snaps) >= 3 and all("pool shared" in s and "placeholder" in s for s in snaps[:3]), out
    assert "\x1b" not in out and "\r" not in out


@pytest.mark.timeout(30)
def test_every_without_watch_is_refused_not_one_snapshot(state_dir: Path) -> None:
    # It printed one snapshot and ended: whoever asked for one every 5s
    # waited for the next.
    proc = cli("status", "--every", "5s")
    assert proc.returncode == 64 and proc.stdout == "", proc.stdout
    assert proc.stderr == "slotq status: error: --every is how often --watch redraws: add --watch " \
                          "(see `slotq status --help`)\n"


@pytest.mark.timeout(60)
def test_status_watch_on_a_terminal_redraws_in_place_and_leaves_the_terminal_clean(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate, "--budget", "10m")
    seen = watch_on_a_terminal(3)
    gate.touch()
    assert holder.wait() == 0
    assert seen.startswith(b"\x1b[?1049h\x1b[?25l"), seen[:40]  # the alternate screen, cursor hidden
    assert seen.count(b"\x1b[H") >= 3  # redrawn in place, not scrolled
    assert re.search(rb"\[#*-+\] [\d.]+m?s of 10m00s", seen), seen[-600:]  # the holder's time against its budget
    assert seen.endswith(b"\x1b[?25h\x1b[?1049l"), seen[-40:]  # cursor back, the old screen restored


@pytest.mark.timeout(60)
def test_status_watch_colours_outcomes_on_a_terminal_unless_no_color(state_dir: Path) -> None:
    assert cli("run", "-q", "--", "true").returncode == 0  # a passed run in the history
    screens = {}
    for no_color in ("", "1"):
        env = dict(os.environ, TERM="xterm")
        env.pop("NO_COLOR", None)
        if no_color:
            env["NO_COLOR"] = no_color
        screens[no_color] = watch_on_a_terminal(1, env=env, until=lambda b: b"recent runs" in b)
    assert b"\x1b[32mpassed" in screens[""]
    assert b"passed" in screens["1"] and b"\x1b[32m" not in screens["1"]


@pytest.mark.timeout(60)
def test_status_watch_on_a_narrow_terminal_cuts_each_line_to_its_width(state_dir: Path, runs: Start,
                                                                        tmp_path: Path) -> None:
    # Lines wider than the terminal wrapped: each frame was taller than the
    # screen, scrolled it, and the next frame, drawn from the top, left the
    # last one's lines below it.
    assert cli("run", "-q", "--label", "a passed run with a label as long as a line " * 3, "--", "true"
               ).returncode == 0
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate, "--budget", "10m", "--label", "wide 日本語 " * 10)
    seen = watch_on_a_terminal(2, columns=50)
    gate.touch()
    assert holder.wait() == 0
    frame = seen.decode().split("\x1b[H")[1].split("\x1b[J")[0]
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in frame.split("\x1b[K\r\n")]
    widths = [cells(ln) for ln in lines]
    assert max(widths) <= 49 and max(widths) >= 45, list(zip(widths, lines))
    assert any(ln.startswith("  shared#0: wide 日本語") and ln.endswith("…") for ln in lines), lines
    assert any(re.match(r"  passed +waited .*…$", ln) for ln in lines), lines
    assert "\x1b[32mpassed" in frame  # the colour kept, and ended where the line was cut
    cut = next(ln for ln in frame.split("\x1b[K\r\n") if "\x1b[32mpassed" in ln)
    assert cut.endswith("…\x1b[0m") or cut.count("\x1b[0m") == 1, repr(cut)



@pytest.mark.timeout(60)
def test_on_a_narrow_terminal_the_waiting_line_fits_its_width_wide_characters_too(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # It was cut by characters: a holder's label in CJK (two cells each)
    # made the line twice as wide as the terminal, and each redraw, which
    # erases one line, left the wrapped part behind.
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate, "--label", "日本語のテスト" * 10)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))  # the label starts at about 45
    proc = subprocess.Popen(slotq_cmd() + ["run", "--", "true"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env=dict(os.environ, TERM="xterm"))
    os.close(slave)
    seen = read_pty(master, proc, until=lambda b: "の".encode() in b.split(b"slotq: waiting")[-1], timeout=20)
    gate.touch()
    seen += read_pty(master, proc)
    os.close(master)
    assert proc.wait(timeout=10) == 0 and holder.wait() == 0
    redraws = re.findall(r"\r\x1b\[2K(slotq: waiting [^\r\n]*)", seen.decode())
    assert redraws, seen
    for line in redraws:
        assert cells(line) <= 59, line
    assert redraws[-1].endswith("…"), redraws[-1]



if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


@pytest.mark.timeout(60)
def test_the_first_status_line_names_the_run_id_which_run_id_can_set(state_dir: Path, runs: Start,
                                                                     tmp_path: Path) -> None:
    proc = cli("run", "--run-id", "ci4711a", "--json", str(tmp_path / "r.json"), "--", "true")
    assert proc.returncode == 0, proc.stderr
    first, *rest = proc.stderr.splitlines()
    assert first.startswith("slotq: slot shared#0 acquired after") and first.endswith("; run ci4711a"), first
    assert not any("ci4711a" in line for line in rest)
    assert json.loads((tmp_path / "r.json").read_text())["run_id"] == "ci4711a"
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    waiting = runs("--report-every", "0.2", "--", "true", name="waiting")
    wait_for(lambda: waiting.err.count("slotq: waiting") >= 2, what="two status lines")
    lines = waiting.err.splitlines()
    assert lines[0].startswith("slotq: waiting") and lines[0].endswith(f"; run {ticket_run_id(state_dir)}")
    assert "; run " not in lines[1]
    gate.touch()
    assert waiting.wait() == 0
    bad = cli("run", "--run-id", "no spaces", "--", "true")
    assert bad.returncode == 64 and "option --run-id: 'no spaces' is not a run id" in bad.stderr
    again = cli("run", "--run-id", "ci4711a", "--", "true")
    assert again.returncode == 64 and again.stderr.count("\n") == 1, again.stderr
    assert "--run-id ci4711a: a run with that id has already run here (passed)" in again.stderr


def ticket_run_id(state_dir: Path) -> str:
    from slotq.host.line import read_info

    (path,) = live_tickets(state_dir)
    return str((read_info(path) or {}).get("run_id"))
