"""End to end through the installed CLI and the library, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import (Start, blocked_in_flock, children, first_waited, gate_cmd, group_alive, history_written,
                      live_tickets, one_line, one_waiting_ahead, run_in_thread, slot_holder, slotq_cmd, spool_ops, start_holder,
                      wait_for)
from slotq import history, protocol
from slotq.client.caller import run
from slotq.clock import Clock, Timer
from slotq.host.slot import read_slot
from slotq.spec import RunSpec
from slotq.transports.local import LocalTransport

class RecordingClock(Clock):
    """The real clock, remembering every timer created and when (wall)."""

    def __init__(self) -> None:
        self.timers: list[tuple[Timer, float]] = []

    def timer(self, name: str, seconds: float) -> Timer:
        t = super().timer(name, seconds)
        self.timers.append((t, self.wall()))
        return t


@pytest.mark.timeout(40)
def test_queue_longer_than_budget_still_passes_and_backstop_starts_at_slot(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    held_on: list[bool] = []

    def release_after_four_seconds_of_waiting() -> None:
        # Status counts on the wall clock, the result on the monotonic one; a
        # wall clock being slewed (NTP: up to 0.5 % fast) says 4.0 s at 3.98.
        wait_for(lambda: first_waited(state_dir) > 4.1, timeout=20, what="4 s of waiting")
        held_on.append(holder.proc.poll() is None)
        gate.touch()

    opener = threading.Thread(target=release_after_four_seconds_of_waiting, daemon=True)
    opener.start()
    clock = RecordingClock()
    out_r, out_w = os.pipe()
    spec = RunSpec(["echo", "ran"], budget=1.0, cwd=str(tmp_path))
    result = run(spec, LocalTransport(), clock=clock, stdout_fd=out_w)
    opener.join(5)
    assert held_on == [True]  # the holder ran all along: the wait was a real one
    os.close(out_w)
    assert os.read(out_r, 100) == b"ran\n"
    assert result.outcome.value == "passed", result.message
    assert result.waited_s is not None and result.waited_s >= 4.0
    assert [(t.name, round(t.length, 6)) for t, _ in clock.timers] == [("backstop", 91.0)]
    (_, created_wall), = clock.timers
    assert result.phases["slot"] is not None and created_wall >= result.phases["slot"]
    assert holder.wait() == 0


@pytest.mark.timeout(30)
def test_an_uncontended_run_says_it_waited_nothing(state_dir: Path, runs: Start) -> None:
    # Its wait ends at the slot event, whether or not it ever had to wait:
    # not at the end of the run (a run that needed no wait record once
    # reported its whole run as its wait).
    r = runs("--", "sleep", "0.5")
    assert r.wait() == 0
    res = r.result()
    assert res["ran_s"] >= 0.5 and res["waited_s"] < 0.25, res
    import re

    summary = re.search(r"slotq: passed \(exit 0\), waited (\d+)ms, ran ", r.err)  # not "waited 505ms"
    assert summary is not None and int(summary.group(1)) < 250, r.err


@pytest.mark.timeout(40)
def test_a_quiet_run_behind_others_without_a_keeper_keeps_its_wait_record_alive_itself(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Far back in line a quiet run's host sends no reports, which carried the
    # wait record's heartbeat. In a pool of several slots no standby keeper
    # waits for it (a keeper would close the record if the caller died):
    # the caller refreshes the record itself, so a quiet waiter killed there
    # has its wait end near its death, not at its start.
    from slotq.client.ledger import Ledger

    (tmp_path / "host.toml").write_text("[pools]\nshared = 2\nlanding = 1\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(tmp_path / "host.toml"))
    gate = tmp_path / "gate"
    for i in range(2):
        runs("-q", "--", *gate_cmd(gate), name=f"holder{i}")
    wait_for(lambda: all(read_slot(str(state_dir), "shared", i)[0] for i in range(2))
             and not live_tickets(state_dir), what="both slots held")
    one_waiting_ahead(runs, state_dir)
    ledger = str(tmp_path / "ledger.sqlite")
    spec = RunSpec(["true"], budget=30, cwd=str(tmp_path), quiet=True)
    t, results = run_in_thread(spec, heartbeat_every=0.05, ledger_path=ledger)

    def refreshed() -> float:
        led = Ledger(ledger)
        try:
            waits = led.credit(str(tmp_path), 0, 2e9).in_progress
        finally:
            led.close()
        return max((w.record.heartbeat - w.record.start for w in waits if w.record.run_id == spec.run_id),
                   default=0.0)

    wait_for(lambda: refreshed() >= 0.5, what="the open wait record refreshed for 0.5 s")
    gate.touch()
    t.join(timeout=20)
    assert results and results[0].outcome.value == "passed", results


@pytest.mark.timeout(40)
def test_a_quiet_run_far_back_in_a_local_one_slot_line_never_wakes_to_refresh_its_wait(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Its standby keeper closes the wait record if the caller dies (the test
    # below), so the caller has nothing to refresh: not one wake-up in line
    # until its turn. Refreshing every 20 ms, it would have written a dozen
    # heartbeats in the quarter second watched.
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    one_waiting_ahead(runs, state_dir)
    ledger = str(tmp_path / "ledger.sqlite")
    spec = RunSpec(["true"], budget=30, cwd=str(tmp_path), quiet=True)
    key = f"{spec.run_id}:queue"
    t, results = run_in_thread(spec, heartbeat_every=0.02, ledger_path=ledger)
    wait_for(lambda: spool_ops(ledger, key, "open"), what="the wait record opened")
    # The one refresh that comes with the host's `queued` event, and no more.
    time.sleep(0.25)  # sleep-ok: a dozen refresh periods, in which nothing may happen
    assert len(spool_ops(ledger, key, "beat")) == 1, spool_ops(ledger, key, "beat")
    gate.touch()
    t.join(timeout=20)
    assert results and results[0].outcome.value == "passed", results
    assert len(spool_ops(ledger, key, "close")) == 1


@pytest.mark.timeout(40)
@pytest.mark.parametrize("pile_up", [False, True], ids=["one-stop", "stops-piled-up"])
def test_a_quiet_waiter_killed_with_its_group_has_its_wait_closed_at_the_kill_by_its_keeper(
        state_dir: Path, runs: Start, tmp_path: Path, pile_up: bool) -> None:
    # A harness's timeout, far back in line: kill -9 of the caller's process
    # group. The standby keeper (a session of its own) outlives it and ends
    # the wait record at that moment, so an outer runner credits the wait
    # the caller really spent, though the caller never refreshed it.
    # stops-piled-up: the parent-death signal comes again each time the
    # kernel hands the keeper on to another dying thread of the caller;
    # here a burst of them, and the keeper must still finish the first
    # stop's work.
    from slotq.client.ledger import Ledger

    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    one_waiting_ahead(runs, state_dir)
    victim = subprocess.Popen(slotq_cmd() + ["run", "-q", "--label", "victim", "--", "true"], cwd=tmp_path,
                              stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ledger = os.environ["SLOTQ_LEDGER"]

    def opened() -> dict[str, Any] | None:
        try:
            lines = Path(ledger + ".spool").read_text().splitlines()
        except FileNotFoundError:
            return None
        return next((e for e in map(json.loads, lines) if e.get("op") == "open" and e.get("pid") == victim.pid),
                    None)

    wait_for(lambda: opened() is not None, what="the victim's wait record opened")
    keeper = wait_for(lambda: next((c for c in children(victim.pid) if blocked_in_flock(c)), None),
                      what="its keeper waiting")
    record = opened()
    assert record is not None
    wait_for(lambda: time.time() >= record["start"] + 1.0, what="a wait of a second")
    killed_at = time.time()
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    for _ in range(3000 if pile_up else 0):
        try:
            os.kill(keeper, signal.SIGTERM)
        except ProcessLookupError:
            break
    wait_for(lambda: spool_ops(ledger, record["key"], "close"), what="the keeper closing the wait")
    led = Ledger(ledger)
    try:
        waits = [w for w in led.credit(str(tmp_path), 0, 2e9).waits if w.record.run_id == record["run_id"]]
    finally:
        led.close()
    assert len(waits) == 1 and waits[0].closed_by == "end", [w.to_dict() for w in waits]
    assert killed_at - record["start"] - 0.05 <= waits[0].seconds <= time.time() - record["start"]
    gate.touch()
    wait_for(lambda: any(r.get("label") == "victim" and r.get("outcome") == "caller_gone"
                         for r in history.recent(str(state_dir), 10)), what="the victim's history line")


@pytest.mark.timeout(30)
def test_waiting_is_visible_with_position_holder_and_load(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    q = runs("--report-every", "0.2", "--label", "queued", "--", "true", name="queued")
    wait_for(lambda: q.err.count("slotq: waiting") >= 2, what="two status lines")
    gate.touch()
    assert q.wait() == 0
    err = q.err
    line = next(l for l in err.splitlines() if l.startswith("slotq: waiting"))
    assert "position 1 in pool shared (0 ahead)" in line
    import pwd

    assert f"slot held by placeholder (user {pwd.getpwuid(os.getuid()).pw_name}) for" in line
    assert f"/{os.cpu_count()} cores" in line and "load " in line
    assert "slotq: slot shared#0 acquired after" in err


@pytest.mark.timeout(40)
@pytest.mark.timeout(30)
def test_a_command_that_runs_too_long_is_exec_timeout_and_says_when_it_got_the_slot(
        state_dir: Path, runs: Start) -> None:
    r = runs("--budget", "1", "--kill-grace", "1", "--", "sleep", "30")
    assert r.wait() == 124
    res = r.result()
    assert res["outcome"] == "exec_timeout" and res["blame"] == "work"
    assert "slot acquired at" in res["message"] and "budget of 1.0s" in res["message"]
    assert 0.9 <= res["ran_s"] < 5


@pytest.mark.timeout(40)
def test_idle_watchdog_ignores_queue_and_prepare_time(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    r = runs("--idle", "1", "--prepare", "sleep 1.5", "--", "sh", "-c", "echo a; sleep 0.5; echo b")
    wait_for(lambda: first_waited(state_dir) > 1.2, what="more than the idle limit of waiting")
    gate.touch()
    assert r.wait() == 0, r.err
    res = r.result()
    assert res["outcome"] == "passed"
    assert res["waited_s"] >= 1.0
    assert res["phases"]["started"] - res["phases"]["slot"] >= 1.4  # the prepare step ran, silent


@pytest.mark.timeout(30)
def test_a_silent_command_ends_idle_timeout(state_dir: Path, runs: Start) -> None:
    r = runs("--idle", "1", "--kill-grace", "1", "--", "sh", "-c", "echo hi; sleep 30")
    assert r.wait() == 123
    res = r.result()
    assert res["outcome"] == "idle_timeout"
    assert res["message"] == "no output for 1.0s after the command started (--idle): stopped"
    hist = json.loads(subprocess.run(slotq_cmd() + ["history", "--json"], capture_output=True, text=True,
                                     timeout=20).stdout)
    assert [h["message"] for h in hist] == ["stopped by the caller's --idle watchdog: no output for its limit"]
    assert res["ran_s"] < 10
    assert r.out == b"hi\n"


@pytest.mark.timeout(30)
def test_landing_runs_on_its_own_slot_while_shared_is_busy(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    land = runs("--class", "landing", "--", "echo", "merged")
    assert land.wait() == 0
    assert land.out == b"merged\n"
    assert land.result()["slot"] == "landing#0"
    assert holder.proc.poll() is None and slot_holder(state_dir) is not None
    gate.touch()
    assert holder.wait() == 0


@pytest.mark.timeout(30)
def test_caller_sigkilled_while_queued_loses_its_ticket_at_once(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    q = runs("--", "true", name="queued")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="ticket in line")
    t0 = time.monotonic()
    q.kill()
    # The ticket's life is the kernel's lock: it ends with the process. (The
    # file goes then too if the run's standby keeper held it, else at the
    # next look along the line -- this probe removes it.)
    # "At once": by the kernel, not by anyone's poll (the holder keeps the
    # slot all along, so nothing else moves the line). The bound is generous
    # for a busy machine; the latency itself is the benchmarks' business.
    wait_for(lambda: not live_tickets(state_dir), timeout=5.0, what="ticket no longer live")
    assert time.monotonic() - t0 < 5.0
    assert slot_holder(state_dir) is not None
    gate.touch()


@pytest.mark.timeout(30)
def test_caller_sigkilled_while_running_leaves_no_process_and_frees_the_slot(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    pidf = tmp_path / "pgid"
    r = runs("--kill-grace", "1", "--", "sh", "-c",
             f"trap '' TERM; echo $$ > {pidf}; sleep 100 & sleep 100")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="command running")
    pgid = int(pidf.read_text())
    t0 = time.monotonic()
    r.kill()
    # Within the kill grace (1 s) plus a moment -- a generous one, for a busy
    # machine: the command ignores TERM, so only the KILL after the grace
    # ends it, never the caller's own death.
    wait_for(lambda: not group_alive(pgid), timeout=1 + 4, what="command group gone")
    wait_for(lambda: slot_holder(state_dir) is None, timeout=4, what="slot free")
    assert time.monotonic() - t0 <= 1 + 4
    last = wait_for(lambda: (history.recent(str(state_dir), 1) or [{}])[0], what="history record")
    assert last["outcome"] == "caller_gone"


def test_a_closed_stdout_reaches_the_command_as_in_a_pipeline(state_dir: Path, tmp_path: Path) -> None:
    # `slotq run -- seq ... | head -1`: the command meets SIGPIPE as it would
    # without slotq, and its own ending (141) is the run's -- not a cancel.
    proc = subprocess.run(
        ["bash", "-c", " ".join(slotq_cmd()) + " run -q --json r.json -- seq 1 2000000 | head -1; "
         "echo \"${PIPESTATUS[0]}\""], capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert proc.stdout == "1\n141\n", proc.stdout + proc.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert (res["outcome"], res["exit_code"], res["command_exit_code"]) == ("failed", 141, 141), res
    # A command that ignores SIGPIPE gets EPIPE on its write instead.
    script = "import sys\ntry:\n    while True: print('y', flush=True)\nexcept BrokenPipeError:\n    sys.exit(7)\n"
    proc = subprocess.run(
        ["sh", "-c", " ".join(slotq_cmd()) + f" run -q --json r2.json -- {sys.executable} -c \"$0\" | head -1",
         script], capture_output=True, text=True, timeout=20, cwd=tmp_path)
    res = json.loads((tmp_path / "r2.json").read_text())
    assert (res["outcome"], res["exit_code"]) == ("failed", 7), res


@pytest.mark.timeout(60)
def test_output_that_cannot_be_written_is_a_warning_not_silence(state_dir: Path, tmp_path: Path) -> None:
    # `slotq run -- make > /dev/full` (a full disk): the output was dropped
    # without a word, as if the reader had gone. It is said, once.
    proc = subprocess.run(["sh", "-c", 'exec "$@" > /dev/full', "sh", *slotq_cmd(), "run", "-q", "--json",
                           str(tmp_path / "r.json"), "--", "sh", "-c", "echo out; echo err >&2"],
                          capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "slotq: warning: cannot write the command's stdout (No space left on device): the rest of it is dropped, "
        "and the command's stdout is closed", "err"] or proc.stderr.splitlines() == [
        "err", "slotq: warning: cannot write the command's stdout (No space left on device): the rest of it is "
        "dropped, and the command's stdout is closed"], proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["outcome"] == "passed"  # the command's own ending


@pytest.mark.timeout(60)
@pytest.mark.parametrize("closed, out, err", [(">&-", b"", True), ("2>&-", b"out\n", False), ("<&-", b"out\n", True)])
def test_a_run_started_with_a_standard_stream_closed_runs_and_keeps_the_state_files_clean(
        state_dir: Path, tmp_path: Path, closed: str, out: bytes, err: bool) -> None:
    # A closed descriptor 0, 1 or 2 would be the next file or pipe slotq
    # opens (the ticket counter, a control pipe), then read or written as
    # the stream. slotq opens /dev/null there first.
    result = tmp_path / "r.json"
    proc = subprocess.run(["sh", "-c", f'exec "$@" {closed}', "sh", *slotq_cmd(), "run", "--json", str(result),
                           "--", "sh", "-c", "echo out; echo err >&2"], capture_output=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == out and (b"\nerr\n" in proc.stderr if err else proc.stderr == b""), (proc.stdout, proc.stderr)
    assert json.loads(result.read_text())["outcome"] == "passed"
    assert (state_dir / "seq").read_bytes().strip().isdigit()
    lines = history_written(state_dir)
    assert len(lines) == 1 and lines[0]["outcome"] == "passed"
    held, record = read_slot(str(state_dir), "shared", 0)
    assert not held and record is None
    slot_file = state_dir / "slots" / "shared.0"
    assert not slot_file.exists() or json.loads(slot_file.read_bytes() or b"{}").get("phase") in (None, "running")


@pytest.mark.timeout(30)
def test_runner_sigkilled_while_holding_takes_its_command_down_before_the_next_starts(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    pidf = tmp_path / "pgid"
    verdict = tmp_path / "verdict"
    runs("--kill-grace", "0.5", "--", "sh", "-c", f"trap '' TERM; echo $$ > {pidf}; sleep 100 & sleep 100",
         name="first")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="first command running")
    pgid = int(pidf.read_text())
    check = Path(__file__).with_name("pgroup.py")
    nxt = runs("--", "sh", "-c", f"{sys.executable} {check} {pgid} > {verdict}", name="next")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="next in line")
    runner_pid = int((slot_holder(state_dir) or {})["pid"])
    os.kill(runner_pid, signal.SIGKILL)
    assert nxt.wait() == 0
    assert verdict.read_text().strip() == "clean"
    assert not group_alive(pgid)


@pytest.mark.timeout(30)
def test_forged_events_and_binary_output_pass_through_unchanged(state_dir: Path, tmp_path: Path) -> None:
    payload = (b"slot acquired\n" + protocol.MAGIC + protocol.event_frame("slot", 1.0, slot="fake", budget=0)
               + protocol.event_frame("exited", 1.0, outcome="passed", exit_code=0) + bytes(range(256)) * 4)
    blob = tmp_path / "blob"
    blob.write_bytes(payload)
    clock = RecordingClock()
    out_r, out_w = os.pipe()
    result = run(RunSpec(["cat", str(blob)], budget=30, cwd=str(tmp_path)), LocalTransport(), clock=clock,
                 stdout_fd=out_w)
    os.close(out_w)
    got = b""
    while chunk := os.read(out_r, 65536):
        got += chunk
    assert got == payload, (len(got), len(payload), result.outcome, result.message)
    assert result.outcome.value == "passed" and result.slot == "shared#0", (result.outcome, result.slot,
                                                                             result.message)
    assert [(t.name, round(t.length, 6)) for t, _ in clock.timers] == [("backstop", 120.0)]  # (monotonic floats)
    # The same through the CLI's own stdout.
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "cat", str(blob)], capture_output=True, timeout=20)
    assert proc.returncode == 0 and proc.stdout == payload, (proc.returncode, len(proc.stdout), proc.stderr)


@pytest.mark.timeout(60)
def test_a_quiet_run_says_only_an_ending_slotq_decided(state_dir: Path, tmp_path: Path) -> None:
    """-q silences the progress lines: a run that passed or failed says
    nothing (but for a command that could not be started). An ending of
    slotq's own (a timeout, unavailable, not admitted) was silent too: a
    harness saw exit 124 and a test suite cut short, and no word of why.
    It now gets the one summary line."""
    def quiet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=30, cwd=tmp_path)

    for args, code in ((["run", "-q", "--", "true"], 0), (["run", "-q", "--", "false"], 1),
                       (["task", "-q", "--budget", "30s", "--", "false"], 1)):
        proc = quiet(*args)
        assert (proc.returncode, proc.stderr) == (code, ""), (args, proc.stderr)
    for args, code, needle in (
            (["run", "-q", "--budget", "0.5s", "--kill-grace", "0", "--", "sleep", "30"], 124,
             "slotq: exec_timeout, waited "),
            (["run", "-q", "--idle", "0.5s", "--kill-grace", "0", "--", "sleep", "30"], 123, "slotq: idle_timeout"),
            (["run", "-q", "--prepare", "exit 3", "--", "true"], 120, "prepare step exited 3"),
            (["run", "-q", "--host", "127.0.0.1", "--ssh-option", "Port=1", "--ssh-option", "ConnectTimeout=5",
              "--", "true"], 121, "slotq: unavailable"),
            (["task", "-q", "--budget", "0.5s", "--kill-grace", "0", "--", "sleep", "30"], 119,
             "slotq task: budget_exhausted"),
            # A command that could not be started has no words of its own
            # (a shell would say "not found"): it was exit 127 and silence.
            (["run", "-q", "--", "no-such-cmd-xyz"], 127, "command not found: 'no-such-cmd-xyz'"),
            (["run", "-q", "--", str(tmp_path)], 126, "cannot execute: '"),
            (["task", "-q", "--budget", "30s", "--", "no-such-cmd-xyz"], 127,
             "slotq task: failed after 0.0s — command not found: 'no-such-cmd-xyz'")):
        proc = quiet(*args)
        assert proc.returncode == code, (args, proc.returncode, proc.stderr)
        assert needle in one_line(proc), (args, proc.stderr)


def test_a_command_that_does_not_exist_fails_127_with_a_clear_message(state_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run(slotq_cmd() + ["run", "--json", str(out), "--", "no-such-cmd-xyz"],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 127
    res = json.loads(out.read_text())
    assert res["outcome"] == "failed" and res["exit_code"] == 127
    assert "command not found: 'no-such-cmd-xyz'" in res["message"]
    assert "command not found" in proc.stderr


@pytest.mark.timeout(60)
def test_a_script_without_a_shebang_runs_with_sh_as_execvp_runs_it(state_dir: Path, tmp_path: Path) -> None:
    # `timeout 60 ./check.sh`, env, xargs and the shells run a script with
    # no #! line with /bin/sh (execvp); slotq's posix_spawnp did not: exit
    # 126, "Exec format error". By path, and found in PATH, with arguments.
    script = tmp_path / "bin" / "check.sh"
    script.parent.mkdir()
    script.write_text('echo "ran with $# args: $1|$2"; exit 3\n')
    script.chmod(0o755)
    env = dict(os.environ, PATH=f"{script.parent}:{os.environ['PATH']}")
    for argv in (["./bin/check.sh"], ["check.sh"]):
        proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", *argv, "a b", "c"], capture_output=True, text=True,
                              timeout=20, cwd=tmp_path, env=env)
        assert (proc.returncode, proc.stdout, proc.stderr) == (3, "ran with 2 args: a b|c\n", ""), argv
    # One not executable at all is still 126.
    script.chmod(0o644)
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "./bin/check.sh"], capture_output=True, text=True,
                          timeout=20, cwd=tmp_path)
    assert proc.returncode == 126 and "cannot execute: './bin/check.sh' (Permission denied)" in proc.stderr


@pytest.mark.timeout(60)
def test_a_script_whose_interpreter_is_missing_says_so_not_command_not_found(
        state_dir: Path, tmp_path: Path) -> None:
    # It said "command not found: './check.sh'" of a file that is there.
    script = tmp_path / "bin" / "check.sh"
    script.parent.mkdir()
    script.write_text("#!/nonexistent/python9\nprint('x')\n")
    script.chmod(0o755)
    env = dict(os.environ, PATH=f"{script.parent}:{os.environ['PATH']}")
    for argv, shown in ((["./bin/check.sh"], "'./bin/check.sh'"), (["check.sh"], "'check.sh'")):
        proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", *argv], capture_output=True, text=True, timeout=20,
                              cwd=tmp_path, env=env)
        assert proc.returncode == 127, proc.stderr
        assert proc.stderr.endswith(f"cannot execute: {shown}: the interpreter its #! line names is not found\n"), \
            proc.stderr
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "./bin/gone.sh"], capture_output=True, text=True,
                          timeout=20, cwd=tmp_path)
    assert proc.returncode == 127 and "command not found: './bin/gone.sh'" in proc.stderr  # not there at all


def test_status_shows_holder_and_waiting_line_as_json(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate, "--budget", "5m")
    runs("--label", "second", "--", "true", name="second")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="second in line")
    proc = subprocess.run(slotq_cmd() + ["status", "--json"], capture_output=True, text=True, timeout=20)
    snap = json.loads(proc.stdout)
    shared = next(p for p in snap["pools"] if p["pool"] == "shared")
    slot = shared["slots"][0]
    assert slot["held"] and slot["label"] == "placeholder" and slot["phase"] == "running" and slot["budget"] == 300
    assert [w["label"] for w in shared["waiting"]] == ["second"]
    assert snap["cores"] == os.cpu_count()
    text = subprocess.run(slotq_cmd() + ["status"], capture_output=True, text=True, timeout=20).stdout
    assert "placeholder" in text and "waiting 1: second" in text
    gate.touch()


STOP_MY_RUNNER = """
import os, signal, time
keeper = os.getppid()
with open(f"/proc/{keeper}/stat") as f:
    runner = int(f.read().rsplit(")", 1)[1].split()[1])
with open("pgid", "w") as f:
    f.write(str(os.getpgid(0)))
os.kill(runner, signal.SIGSTOP)
time.sleep(100)  # sleep-ok: the command under test idles; the test waits by condition
"""


@pytest.mark.timeout(30)
def test_a_silent_host_ends_in_backstop_and_the_command_is_ended(state_dir: Path, tmp_path: Path) -> None:
    spec = RunSpec([sys.executable, "-c", STOP_MY_RUNNER], budget=1.0, kill_grace=0.5, cwd=str(tmp_path))
    t0 = time.monotonic()
    # The host side in a process of its own (as `slotq host run` is on a
    # remote host), so that the command can stop it without stopping us.
    result = run(spec, LocalTransport(in_process=False), backstop_margin=0.5)
    assert result.outcome.value == "backstop" and result.blame == "infrastructure"
    assert result.exit_code == 122
    assert 1.4 <= time.monotonic() - t0 < 10
    pgid = int((tmp_path / "pgid").read_text())
    wait_for(lambda: not group_alive(pgid), timeout=5, what="command ended after the runner was killed")
    wait_for(lambda: slot_holder(state_dir) is None, timeout=5, what="slot free")


@pytest.mark.timeout(40)
@pytest.mark.parametrize("slots", [1, 2])
def test_runs_without_inotify_instances_keep_order_and_finish(state_dir: Path, tmp_path: Path, slots: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Hundreds of waiters exhaust the per-user inotify instances. With two
    # slots the runs that get none wait on blocked-flock threads; in a
    # one-slot line no run asks for one (their keepers wait in flock(2)).
    cfg = tmp_path / "host.toml"
    cfg.write_text(f"[pools]\nshared = {slots}\nlanding = 1\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(cfg))
    gate = tmp_path / "gate"
    log = tmp_path / "order"
    helper = Path(__file__).with_name("no_inotify_instances.py")
    holders = [subprocess.Popen(slotq_cmd() + ["run", "-q", "--", *gate_cmd(gate)]) for _ in range(slots)]
    waiters: list[subprocess.Popen[bytes]] = []
    try:
        wait_for(lambda: all((read_slot(str(state_dir), "shared", i)[1] or {}).get("phase") == "running"
                             for i in range(slots)) and not live_tickets(state_dir),
                 what="slots held, and the holders out of the line")
        asked = tmp_path / "inotify-asked"
        monkeypatch.setenv("SLOTQ_TEST_INOTIFY_LOG", str(asked))
        for i in range(4):
            waiters.append(subprocess.Popen([sys.executable, str(helper), "run", "-q", "--", "sh", "-c",
                                             f"echo {i} >> {log}"]))
            wait_for(lambda: len(live_tickets(state_dir)) == i + 1, what=f"ticket {i}")
        if slots == 2:
            # Each waiter asked for an inotify instance, was refused, and waits
            # in a thread blocked in flock(2) -- not in a poll, which would show
            # no blocked lock.
            wait_for(lambda: asked.exists() and len(set(asked.read_text().split())) == 4, what="4 refusals")
            wait_for(lambda: all(blocked_in_flock(w.pid) for w in waiters), what="every waiter blocked in flock")
        else:
            # In a one-slot line the waiters never ask: their keepers wait in flock.
            assert not asked.exists()
        gate.touch()
        assert [w.wait(timeout=20) for w in waiters] == [0, 0, 0, 0]
        assert [h.wait(timeout=20) for h in holders] == [0] * slots
        order = log.read_text().split()
        assert sorted(order) == ["0", "1", "2", "3"]
        if slots == 1:
            assert order == ["0", "1", "2", "3"]
    finally:
        gate.touch()  # a failed check must not leave the holders polling
        for p in [*holders, *waiters]:
            if p.poll() is None:
                p.kill()
                p.wait()
