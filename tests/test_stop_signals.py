"""Stop signals to `slotq run` (Ctrl-C, a harness's SIGTERM, SIGHUP when
the terminal closes): a cancel with its line and its result in every
phase -- while slotq starts, in line, in the prepare step, while the
command runs -- and never one slotq was started with ignored."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import Start, group_alive, running_with, slotq_cmd, start_holder, wait_for

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}  # as the messages say them


def host_history_message(run_id: object) -> str:
    """What the host's history says of the run (the caller tells the host
    which stop signal it was sent: `cancel SIGTERM`)."""
    out = subprocess.run(slotq_cmd() + ["history", "--json"], capture_output=True, text=True, timeout=20).stdout
    return str(next(h["message"] for h in json.loads(out) if h["run_id"] == run_id))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"])
def test_ctrl_c_sigterm_or_sighup_cancels_the_run_and_still_reports_and_the_history_names_it(
        state_dir: Path, runs: Start, tmp_path: Path, sig: signal.Signals) -> None:
    pidf = tmp_path / "pgid"
    r = runs("--kill-grace", "1", "--", "sh", "-c", f"echo $$ > {pidf}; sleep 100")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="command running")
    r.proc.send_signal(sig)
    assert r.wait() == 130
    assert r.result()["outcome"] == "cancelled"
    name = NAMES[sig]
    assert r.result()["message"] == f"cancelled ({name}) while the command ran: stopped"
    assert not group_alive(int(pidf.read_text()))
    assert host_history_message(r.result()["run_id"]) == f"cancelled ({name}) while the command ran: stopped"


@pytest.mark.timeout(30)
def test_a_sigterm_during_the_prepare_step_says_so_here_and_in_the_history(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    pidf, ran = tmp_path / "prepare-pid", tmp_path / "ran"
    r = runs("--kill-grace", "1", "--prepare", f"echo $$ > {pidf}; sleep 100", "--", "touch", str(ran))
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="prepare step running")
    r.proc.send_signal(signal.SIGTERM)
    assert r.wait() == 130
    res = r.result()
    assert (res["outcome"], res["message"]) == ("cancelled", "cancelled (SIGTERM) in its --prepare step: stopped")
    assert not ran.exists() and not group_alive(int(pidf.read_text()))
    assert host_history_message(res["run_id"]) == "cancelled (SIGTERM) in its --prepare step: stopped"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"])
@pytest.mark.timeout(60)
def test_a_stop_signal_while_slotq_starts_is_a_cancel_with_its_line_and_result(
        state_dir: Path, tmp_path: Path, sig: signal.Signals) -> None:
    # A harness stops a slotq it has just started, before the run's own
    # handlers are set (they come with the runner, 20-40 ms in). That
    # killed it (143, no result; a Ctrl-C: 130, no result), seen in
    # stress runs of 60 callers at once. Held here: the ticket counter is
    # locked by hand, so the run stays in its first try for a ticket,
    # with the counter open, long enough to be signalled there.
    assert subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], timeout=30).returncode == 0  # the counter
    counter = os.open(state_dir / "seq", os.O_RDWR)
    try:
        fcntl.flock(counter, fcntl.LOCK_EX)
        result = tmp_path / "r.json"
        proc = subprocess.Popen(slotq_cmd() + ["run", "--json", str(result), "--", "echo", "RAN"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

        def counter_open() -> bool:
            fds = f"/proc/{proc.pid}/fd"
            try:
                return any(os.readlink(f"{fds}/{fd}") == str(state_dir / "seq") for fd in os.listdir(fds))
            except OSError:
                return False

        wait_for(counter_open, what="slotq trying for its ticket")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(counter)
    assert proc.returncode == 130, err
    assert "RAN" not in out and err.count("\n") == 1 and err.startswith("slotq: cancelled"), err
    name = NAMES[sig]
    res = json.loads(result.read_text())
    # Where it waited: for the ticket counter, which the test holds.
    message = f"cancelled ({name}) while it waited for its place in line (the ticket counter was locked); nothing ran"
    assert (res["outcome"], res["message"]) == ("cancelled", message)
    assert host_history_message(res["run_id"]) == message


def _ignore_hup_and_int() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup does
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell does for its background jobs


def _threads_taking_stops(pid: int) -> tuple[int, list[str]]:
    """How many threads the process has besides its main one, and those of
    them that do not block all three stop signals."""
    stops = sum(1 << (sig - 1) for sig in NAMES)
    others, taking = 0, []
    for tid in os.listdir(f"/proc/{pid}/task"):
        if int(tid) == pid:
            continue
        others += 1
        for line in open(f"/proc/{pid}/task/{tid}/status"):
            if line.startswith("SigBlk:") and int(line.split()[1], 16) & stops != stops:
                taking.append(f"thread {tid}: SigBlk {line.split()[1]}")
    return others, taking


@pytest.mark.timeout(60)
def test_a_stop_signal_is_left_to_the_main_thread_of_a_waiting_or_running_caller(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Found in CI: a caller waiting in line ignored its SIGTERM for ever
    # (about 1 run in 30 on two busy cores). The kernel had given the signal
    # to the runner's thread; Python runs a handler in the main thread only,
    # which slept in select() with no timeout. A thread that blocks the stop
    # signals can never take one, so every thread but the main one must.
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    waiting = runs("--", "true", name="waiting")
    wait_for(lambda: "slotq: waiting" in waiting.err, what="it waits")
    for run in (holder, waiting):
        others, taking = _threads_taking_stops(run.proc.pid)
        assert others >= 1, "no runner thread to check"
        assert taking == [], taking
    waiting.proc.send_signal(signal.SIGTERM)
    assert waiting.wait() == 130
    gate.touch()
    assert holder.wait() == 0


@pytest.mark.parametrize("cmd", [["run", "-q"], ["task", "-q", "--budget", "1m"]])
@pytest.mark.timeout(60)
def test_a_signal_slotq_was_started_with_ignored_stays_ignored(state_dir: Path, tmp_path: Path,
                                                               cmd: list[str]) -> None:
    # `nohup slotq run ...` was cancelled when the terminal closed, and a
    # shell script's background run by the Ctrl-C meant for the script.
    gate, pidf = tmp_path / "gate", tmp_path / "pid"
    proc = subprocess.Popen(slotq_cmd() + cmd + ["--", "sh", "-c", f'echo $$ > {pidf}; while [ ! -e "{gate}" ]; do sleep 0.01; done'],
                            preexec_fn=_ignore_hup_and_int, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="command running")
        for line in open(f"/proc/{proc.pid}/status"):
            if line.startswith("SigIgn:"):
                ignored = int(line.split()[1], 16)
        assert ignored & (1 << (signal.SIGHUP - 1)) and ignored & (1 << (signal.SIGINT - 1)), hex(ignored)
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGINT)
        gate.touch()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(30)
def test_a_stop_signal_the_moment_a_program_starts_ends_that_program_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found under load: a harness's SIGTERM while a remote run connected left
    # its ssh running (with ControlPersist, for ten minutes). The signal came
    # just as posix_spawn returned, and the stop's exception (the caller's
    # handler raises it) left before slotq had noted the program. Here the
    # signal comes at exactly that moment, every time.
    from slotq.transports import proc as procs

    marker = f"slotq-test-started-as-stopped-{os.getpid()}"
    real_spawn = os.posix_spawnp
    listed = set(procs._running)

    def spawn_then_stop(*args: object, **kwargs: object) -> int:
        pid = real_spawn(*args, **kwargs)  # type: ignore[arg-type]
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        return pid

    class Stopped(Exception):
        pass

    def stop(signum: int, frame: object) -> None:
        raise Stopped

    old = signal.signal(signal.SIGTERM, stop)
    monkeypatch.setattr(os, "posix_spawnp", spawn_then_stop)
    try:
        with pytest.raises(Stopped):
            procs.Proc(["sh", "-c", "sleep 100", marker])
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGTERM, old)
        left = running_with(marker)
        if left:  # (the old code's: not left to the suite's leftover check)
            subprocess.run(["pkill", "-f", marker], timeout=10)
    assert left == [], "the program started as the stop came was left running"
    assert procs._running == listed, "a program the stop ended is still listed as running"


def test_every_thread_of_slotq_is_started_by_signals_start_thread() -> None:
    # The rule above holds only if no thread is started another way.
    import ast

    src = Path(__file__).resolve().parent.parent / "src" / "slotq"
    direct = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and (node.func.attr == "start_new_thread" or (node.func.attr == "start" and not node.args))):
                direct.append(f"{path.relative_to(src)}:{node.lineno}")
    assert direct == [], f"threads started without signals.start_thread: {direct}"
