"""The wait ledger and `slotq task` end to end, with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from conftest import Run, first_waited, slotq_cmd, wait_for
from slotq.host.slot import read_slot
from slotq.host.status import waiting

Start = Callable[..., Run]


def hold_shared_slot(runs: Start, state_dir: Path, gate: Path) -> Run:
    """A holder of the shared slot that runs until the test opens `gate`
    (creates the file): never a fixed duration that a busy machine could
    outlast or cut short."""
    h = runs("--label", "placeholder", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.01; done",
             name="holder")
    wait_for(lambda: (read_slot(str(state_dir), "shared", 0)[1] or {}).get("phase") == "running",
             what="placeholder holds the slot")
    return h


def wait_in_line(state_dir: Path, task: subprocess.Popen[str], seconds: float) -> None:
    """Until the first run in line has waited `seconds`; the task must
    outlive it (one look at the line per check: a line read twice may have
    changed between the reads)."""
    def done() -> bool:
        if task.poll() is not None:
            return True
        return first_waited(state_dir) > seconds

    wait_for(done, timeout=20, what=f"{seconds} s of waiting")
    if task.poll() is not None:
        _, err = task.communicate()
        pytest.fail(f"the task ended (exit {task.returncode}) while its run waited in line: {err}")


def start_task(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / f"task{time.monotonic_ns()}.json"
    proc = subprocess.Popen(slotq_cmd() + ["task", "--json", str(out), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, stdin=subprocess.DEVNULL)
    return proc, out


def finish(proc: subprocess.Popen[str], out: Path, timeout: float = 40) -> tuple[int, str, dict]:  # type: ignore[type-arg]
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err, json.loads(out.read_text())


def task(tmp_path: Path, *args: str, timeout: float = 40) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    out = tmp_path / f"task{time.monotonic_ns()}.json"
    proc = subprocess.run(slotq_cmd() + ["task", "--json", str(out), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)
    return proc, json.loads(out.read_text())


@pytest.mark.timeout(60)
def test_task_outlives_its_budget_while_its_inner_run_waits_and_passes(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = hold_shared_slot(runs, state_dir, gate)
    proc, out = start_task(tmp_path, "--budget", "3s", "--recheck", "1s", "--credit-dir", str(tmp_path), "--",
                           *slotq_cmd(), "run", "--budget", "1", "--", "true")
    # Past the task's own budget, its inner run still waiting in line:
    wait_in_line(state_dir, proc, 4.0)  # the task must outlive its budget while the wait is in progress
    assert holder.proc.poll() is None
    gate.touch()
    code, err, res = finish(proc, out)
    assert code == 0, err
    assert res["outcome"] == "passed"
    assert res["elapsed_s"] > 4.0


@pytest.mark.timeout(60)
def test_task_is_extended_by_the_wait_once_it_ends(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    hold_shared_slot(runs, state_dir, gate)
    # The inner run waits ~4.5 s, then works 2 s: the check after its wait
    # ended credits the wait, and the budget (3 s + the wait) covers the work.
    proc, out = start_task(tmp_path, "--budget", "3s", "--recheck", "0.5s", "--credit-dir", str(tmp_path), "--",
                           *slotq_cmd(), "run", "--budget", "5", "--", "sleep", "2")
    wait_in_line(state_dir, proc, 4.5)
    gate.touch()
    code, err, res = finish(proc, out)
    assert code == 0, err
    assert res["outcome"] == "passed"
    assert len(res["extensions"]) == 1
    assert 4.5 <= res["credited_s"] <= 8.0
    assert "budget extended by" in err
    assert res["elapsed_s"] > res["credited_s"] + 2  # the wait, then the 2 s of work


@pytest.mark.timeout(60)
def test_a_wait_in_a_dir_whose_name_is_not_utf8_is_credited_and_listed(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Its path reached the ledger as a lone surrogate, which SQLite refuses:
    # every read of the ledger failed from then on, so `slotq task` could
    # prove no credit for any dir (and ended at its bare budget), and
    # `slotq waits` was an error.
    odd = os.path.join(os.fsencode(tmp_path), b"work\xff")
    os.mkdir(odd)
    gate = tmp_path / "gate"
    hold_shared_slot(runs, state_dir, gate)
    out = tmp_path / "task.json"
    # As in the test above: 3 s of budget, a wait of 4.5 s, then 2 s of work.
    proc = subprocess.Popen(slotq_cmd() + ["task", "--json", str(out), "--budget", "3s", "--recheck", "0.5s",
                                           "--credit-dir", str(tmp_path), "--", *slotq_cmd(), "run",
                                           "--budget", "5", "--", "sleep", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=odd,
                            stdin=subprocess.DEVNULL)
    wait_in_line(state_dir, proc, 4.5)
    gate.touch()
    code, err, res = finish(proc, out)
    assert code == 0 and res["outcome"] == "passed", err
    assert 4.5 <= res["credited_s"] <= 8.0
    listed = subprocess.run(slotq_cmd() + ["waits", "--json", "--dir", os.fsdecode(odd), "--since", "5m"],
                            capture_output=True, text=True, timeout=20)
    assert listed.returncode == 0, listed.stderr
    waits = json.loads(listed.stdout)["waits"]
    assert [(w["kind"], w["workdir"]) for w in waits] == [("queue", f"{tmp_path}/work\\xff")]


@pytest.mark.timeout(60)
def test_a_waiting_run_moves_in_a_spool_that_no_reader_ever_moved(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # A user who never runs `slotq task` or `slotq waits`: the spool of
    # every wait, with its heartbeats, grew for ever.
    from slotq.client import ledger

    limit = getattr(ledger, "SPOOL_MOVE_BYTES", 4 << 20)
    spool = tmp_path / "ledger.sqlite.spool"
    beat = b'{"op": "beat", "key": "long-gone:queue", "at": 1800000000.0}\n'
    spool.write_bytes(beat * (limit // len(beat) + 1))
    gate = tmp_path / "gate"
    hold_shared_slot(runs, state_dir, gate)
    q = runs("--", "true", name="queued")
    wait_for(lambda: spool.stat().st_size < 4096, timeout=15, what="the waiting run moving the spool in")
    assert q.proc.poll() is None  # while it waited
    gate.touch()
    assert q.wait() == 0
    proc = subprocess.run(slotq_cmd() + ["waits", "--json", "--dir", str(tmp_path), "--since", "5m"],
                          capture_output=True, text=True, timeout=20)
    assert [w["run_id"] for w in json.loads(proc.stdout)["waits"]] == [q.result()["run_id"]]


@pytest.mark.timeout(60)
def test_a_delivery_deadline_ends_the_task_at_its_time(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = hold_shared_slot(runs, state_dir, gate)
    try:
        proc, res = task(tmp_path, "--budget", "3s", "--deadline", "3s", "--recheck", "1s", "--kill-grace", "1",
                         "--credit-dir", str(tmp_path), "--", *slotq_cmd(), "run", "--budget", "1", "--", "true")
        assert holder.proc.poll() is None  # the inner run waited all along
    finally:
        gate.touch()
    assert proc.returncode == 118
    assert res["outcome"] == "deadline" and res["blame"] == "task"
    assert 2.9 <= res["elapsed_s"] < 8


@pytest.mark.timeout(30)
def test_a_task_with_nothing_to_credit_ends_budget_exhausted(state_dir: Path, tmp_path: Path) -> None:
    proc, res = task(tmp_path, "--budget", "1s", "--kill-grace", "1", "--", "sleep", "30")
    assert proc.returncode == 119
    assert res["outcome"] == "budget_exhausted" and res["extensions"] == []
    assert res["elapsed_s"] < 5


@pytest.mark.parametrize("argv, says", [
    (["sh", "-c", "kill -9 $$"], "command killed by signal 9"),  # task said "command exited 137"
    (["no-such-cmd-xyz"], "command not found: 'no-such-cmd-xyz' (No such file or directory)"),  # "cannot run"
    (["sh", "-c", "exit 3"], "command exited 3"),
])
@pytest.mark.timeout(30)
def test_a_task_says_how_its_command_ended_as_run_does(state_dir: Path, tmp_path: Path, argv: list[str],
                                                       says: str) -> None:
    proc, res = task(tmp_path, "-q", "--budget", "10s", "--", *argv)
    ran = subprocess.run(slotq_cmd() + ["run", "-q", "--json", "-", "--", *argv], capture_output=True, text=True,
                         timeout=20, cwd=tmp_path)
    assert res["message"] == says == json.loads(ran.stdout)["message"], (res, ran.stdout)
    assert proc.returncode == ran.returncode == res["exit_code"]


def test_a_task_passes_the_commands_own_exit_code_and_stdio(state_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(slotq_cmd() + ["task", "-q", "--budget", "10s", "--", "sh", "-c", "cat; exit 4"],
                          input="piped", capture_output=True, text=True, timeout=20)
    assert proc.returncode == 4 and proc.stdout == "piped"


# Holds `slotq task` where it opens its --json result (before its own
# handlers), blocked reading stdin, until the test writes a byte there.
PAUSE_AT_RESULT = """
import os, runpy, sys
marker, paused = sys.argv[1], []
def hook(event, args):
    if event == "open" and not paused and os.path.basename(str(args[0])).startswith(".result."):
        paused.append(1)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"%d" % os.getpid())
        os.close(fd)
        os.read(0, 1)
sys.addaudithook(hook)
script = sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_signal_while_a_task_starts_is_a_cancel_and_its_job_never_starts(
        state_dir: Path, tmp_path: Path, sig: signal.Signals) -> None:
    # The signal comes before the task's own handlers: here while it opens
    # its --json result. It killed slotq (-15; a Ctrl-C 130 with no
    # result), as `slotq run` was before.
    result, ran, paused = tmp_path / "result", tmp_path / "ran", tmp_path / "paused"
    proc = subprocess.Popen([sys.executable, "-c", PAUSE_AT_RESULT, str(paused), *slotq_cmd(), "task", "--budget",
                             "1m", "--json", str(result), "--", "touch", str(ran)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.PIPE)
    wait_for(lambda: paused.exists() and paused.read_text() == str(proc.pid), what="slotq task opening its result")
    proc.send_signal(sig)
    out, err = proc.communicate(input="go", timeout=20)
    name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    assert proc.returncode == 130, err
    assert err == f"slotq task: cancelled after 0.0s — cancelled ({name}) before the job started; nothing ran\n"
    assert json.loads(result.read_text())["outcome"] == "cancelled" and not ran.exists()


@pytest.mark.timeout(30)
def test_waits_shows_what_a_dir_waited(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    hold_shared_slot(runs, state_dir, gate)
    q = runs("--", "true", name="queued")
    wait_for(lambda: first_waited(state_dir) > 1.2, what="1.2 s of waiting")
    # A wait still open is listed apart, and the total says it is not in it
    # ("total: sum 0ms" under a wait of a second looked wrong).
    text = subprocess.run(slotq_cmd() + ["waits", "--dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=20).stdout
    run_id = waiting(str(state_dir), "shared", time.time())[0]["run_id"]
    assert f"run {run_id}  (in progress, pid {q.proc.pid})" in text, text
    assert text.splitlines()[-1].endswith(" (finished waits; 1 still in progress, not counted)"), text
    gate.touch()
    assert q.wait() == 0
    proc = subprocess.run(slotq_cmd() + ["waits", "--json", "--dir", str(tmp_path), "--since", "5m"],
                          capture_output=True, text=True, timeout=20)
    data = json.loads(proc.stdout)
    waits = [w for w in data["waits"] if w["run_id"] == q.result()["run_id"]]
    assert len(waits) == 1 and waits[0]["kind"] == "queue" and waits[0]["seconds"] >= 1.2
    assert waits[0]["seconds"] == pytest.approx(q.result()["waited_s"], abs=0.5)
    text = subprocess.run(slotq_cmd() + ["waits", "--dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=20).stdout
    assert "total: sum" in text and "queue" in text


@pytest.mark.timeout(30)
def test_the_recorded_wait_ends_when_the_slot_was_acquired_not_when_the_caller_heard(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # It ended when the caller read the host's `slot` event: a caller slow
    # to read it (a busy machine; here, a stopped one) was credited the
    # command's first seconds as waiting.
    gate, done = tmp_path / "gate", tmp_path / "done"
    hold_shared_slot(runs, state_dir, gate)
    q = runs("--", "sh", "-c", f"sleep 1; touch {done}", name="queued")
    wait_for(lambda: first_waited(state_dir) > 0.3, what="a wait")
    q.proc.send_signal(signal.SIGSTOP)
    try:
        gate.touch()
        wait_for(done.exists, what="the command's second, its caller stopped")
    finally:
        q.proc.send_signal(signal.SIGCONT)
    assert q.wait() == 0
    proc = subprocess.run(slotq_cmd() + ["waits", "--json", "--dir", str(tmp_path), "--since", "5m"],
                          capture_output=True, text=True, timeout=20)
    res = q.result()
    waits = [w for w in json.loads(proc.stdout)["waits"] if w["run_id"] == res["run_id"]]
    assert len(waits) == 1
    host_wait = res["phases"]["slot"] - res["phases"]["submitted"]  # the host's own clock, this machine's
    assert waits[0]["seconds"] == pytest.approx(host_wait, abs=0.2), (waits, host_wait)
    assert res["waited_s"] == pytest.approx(host_wait, abs=0.2), (res["waited_s"], host_wait)  # and the result


@pytest.mark.timeout(30)
def test_an_unwritable_ledger_costs_one_warning_and_the_run_passes(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SLOTQ_LEDGER", str(blocker / "ledger.sqlite"))
    gate = tmp_path / "gate"
    holder = hold_shared_slot(runs, state_dir, gate)  # so that the run waits, and records it
    proc = subprocess.Popen(slotq_cmd() + ["run", "-q", "--report-every", "0.2", "--", "echo", "ok"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the one warning, at the first ledger write
    wait_for(lambda: first_waited(state_dir) > 0.7, what="several status reports")
    assert holder.proc.poll() is None
    gate.touch()
    out, rest = proc.communicate(timeout=20)
    assert proc.returncode == 0 and out == "ok\n"
    warnings = [line for line in (first + rest).splitlines() if "warning" in line]
    assert len(warnings) == 1 and "wait ledger" in warnings[0]


@pytest.mark.parametrize("args,needle", [
    (["task", "--", "true"], "--budget"),
    (["task", "--budget", "soon", "--", "true"], "cannot read 'soon'"),
    (["task", "--budget", "5", "--credit", "max", "--", "true"], "'max' is not one of union, sum"),
    (["task", "--budget", "5"], "no command given"),
    (["waits", "--since", "yesterday"], "cannot read 'yesterday'"),
    # a traceback (localtime of a time past what it can show) before
    (["waits", "--until", "1e20"], "--until: '1e20' is beyond the year 9999"),
    (["report", "--html", "/nonexistent-dir/r.html", "--since", "1e300"], "--since: '1e300' is beyond"),
    (["task", "--budget", "5", "--json", "/nonexistent-dir/r.json", "--", "true"], "cannot write --json file"),
    (["run", "--json", "/nonexistent-dir/r.json", "--", "true"], "cannot write --json file"),
])
def test_bad_task_and_waits_arguments_are_one_line_exit_64(state_dir: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(slotq_cmd() + args, capture_output=True, text=True, timeout=20)
    assert proc.returncode == 64
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_an_uncontended_run_costs_no_ledger_write(state_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0
    # It got its slot at once: nothing was waited, so nothing of the ledger
    # was touched -- no database, no spool, no spool lock.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ledger")) == []
    # (The check can fail: a run that waits does write the spool.)
    gate = tmp_path / "gate"
    holder = subprocess.Popen(slotq_cmd() + ["run", "-q", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.01; done"],
                              stdin=subprocess.DEVNULL)
    wait_for(lambda: (read_slot(str(state_dir), "shared", 0)[1] or {}).get("phase") == "running",
             what="holder running")
    waiter = subprocess.Popen(slotq_cmd() + ["run", "-q", "--report-every", "0.05", "--", "true"],
                              stdin=subprocess.DEVNULL)
    wait_for(lambda: (tmp_path / "ledger.sqlite.spool").exists(), what="the waiter's spool")
    gate.touch()
    assert holder.wait(timeout=20) == 0 and waiter.wait(timeout=20) == 0
