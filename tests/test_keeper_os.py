"""The keeper as a real process (host/process.py, host/child.py): it ends
a command's whole group, kills what ignores TERM after the grace, reports
an exec failure, ends its wait on a stop sent the moment it was forked, and
tells a quiet runner `head` only when it has waited at the head that long."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import group_alive, take_slot, wait_for
from slotq.config import HostConfig
from slotq.host.hostqueue import Waiter
from slotq.host.process import Command, KeeperPlan, Standby, Streams, spawn
from slotq.host.slot import SlotLease, SlotProbe

CFG = HostConfig()


def _spawn(argv: list[str], grace: float = 5.0):  # type: ignore[no-untyped-def]
    devnull = os.open(os.devnull, os.O_WRONLY)
    out = os.dup(devnull)
    child = spawn(KeeperPlan(Command(argv, grace=grace), Streams(devnull, out)))
    return child


def _finish(child) -> None:  # type: ignore[no-untyped-def]
    while not child.on_readable():
        pass


def test_stopping_a_command_ends_its_whole_group_and_escaped_descendants(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 100 & echo $! >> {pids}; setsid sleep 101 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    child = _spawn(["sh", "-c", script])
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 3, what="pids written")
    procs = [int(x) for x in pids.read_text().split()]
    t0 = time.monotonic()
    child.stop()
    _finish(child)
    assert time.monotonic() - t0 < 2.0  # by TERM, well before the 5 s grace's KILL
    assert child.end is not None and child.end.stopped
    for pid in procs:
        assert not os.path.exists(f"/proc/{pid}"), f"pid {pid} survived"


def test_leftovers_of_a_finished_command_are_ended(tmp_path: Path) -> None:
    pidf = tmp_path / "pid"
    child = _spawn(["sh", "-c", f"sleep 100 & echo $! > {pidf}"])
    _finish(child)
    assert child.end is not None and child.end.exit_code == 0 and not child.end.stopped
    assert not os.path.exists(f"/proc/{int(pidf.read_text())}")


def test_term_ignoring_command_is_killed_after_grace(tmp_path: Path) -> None:
    pidf = tmp_path / "pid"
    child = _spawn(["sh", "-c", f"trap '' TERM; echo $$ > {pidf}; while :; do sleep 0.05; done"], grace=0.3)
    wait_for(pidf.exists, what="command started")
    pgid = int(pidf.read_text())
    t0 = time.monotonic()
    child.stop()
    _finish(child)
    took = time.monotonic() - t0
    assert child.end is not None and child.end.signal == signal.SIGKILL
    assert 0.25 < took < 2.0
    assert not group_alive(pgid)


@pytest.mark.timeout(60)
def test_a_stop_right_after_a_standby_keeper_is_forked_ends_its_wait(tmp_path: Path) -> None:
    # The runner has its own SIGTERM handler, and a fork inherits it: a stop
    # sent at once must still end the keeper's wait, not be swallowed by
    # that handler in the keeper -- which would then wait on, get the slot
    # and run the command of a run that was cancelled.
    lease = SlotProbe(str(tmp_path), "shared", 1).try_lease()
    assert lease is not None
    old = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        for _ in range(20):
            devnull = os.open(os.devnull, os.O_WRONLY)
            child = spawn(KeeperPlan(Command(["true"]), Streams(devnull, os.dup(devnull)), Standby(lease.path)))
            child.stop()
            wait_for(lambda: select.select([child.done_fd], [], [], 0.05)[0] and child.on_readable(),
                     timeout=5, what="the keeper to end its wait")
            assert child.started is None and child.end is not None and child.end.stopped
    finally:
        signal.signal(signal.SIGTERM, old)
        lease.release()


def test_command_that_does_not_exist_reports_exec_failure() -> None:
    child = _spawn(["slotq-no-such-command-xyz"])
    _finish(child)
    assert child.end is not None and child.end.exit_code == 127 and child.end.exec_errno is not None


def test_an_error_of_the_keepers_own_before_the_start_is_reported_as_such_not_as_a_kill() -> None:
    # A NUL in an argument (possible through the library, not the CLI) makes
    # posix_spawnp raise ValueError in the keeper: something it did not
    # foresee. Silence would read as a SIGKILL of the keeper ("unavailable,
    # keeper killed"), which hid such errors in the chaos scenario.
    child = _spawn(["tr\0ue"])
    _finish(child)
    assert child.end is not None and not child.end.lost
    assert child.end.setup_error is not None and "ValueError" in child.end.setup_error, child.end.setup_error


def test_the_keepers_head_line_and_its_start_read_in_one_chunk_are_both_understood() -> None:
    from slotq.host.child import Child

    r, w = os.pipe()
    child = Child(os.getpid(), r, lingers=True)  # never reaped: only its report is read here
    os.write(w, b"head\nstarted=1.5,2.5,-1\n")
    assert child.on_readable() is False
    assert child.at_head and child.started == (1.5, 2.5) and child.cmd_pid == -1
    os.write(w, b"execfail=2")
    os.close(w)
    assert child.on_readable() is False  # the report
    assert child.on_readable() is True  # end-of-file
    assert child.end is not None and child.end.exec_errno == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize("slot_free", [False, True])
def test_a_standby_keeper_says_head_only_after_waiting_that_long_at_the_head(tmp_path: Path, slot_free: bool) -> None:
    # A quiet run's runner sleeps until its keeper says `head`. A keeper
    # that gets the slot sooner -- in a moving line, every head -- must not
    # wake its runner for it; one still waiting at the head after
    # `tell_head` seconds must.
    lease: SlotLease | None = take_slot(tmp_path)  # (its file exists from now on)
    if slot_free:
        assert lease is not None
        lease.release()
        lease = None
    waiter = Waiter(str(tmp_path), CFG, "shared", {})  # no ticket ahead of it
    waiter.stand_down()
    t = waiter.ticket
    devnull = os.open(os.devnull, os.O_WRONLY)
    t0 = time.monotonic()
    child = spawn(KeeperPlan(Command(["true"]), Streams(devnull, os.dup(devnull)),
                             Standby(waiter.slot_paths()[0], (t.fd, t.path, t.seq), tell_head=0.3)))
    try:
        if lease is not None:
            wait_for(lambda: select.select([child.done_fd], [], [], 0.05)[0] and not child.on_readable()
                     and child.at_head, timeout=10, what="the keeper's `head`")
            assert time.monotonic() - t0 >= 0.3
            assert child.started is None
            lease.release()
        _finish(child)
        assert child.started is not None and child.end is not None and child.end.exit_code == 0
        assert child.at_head is not slot_free
    finally:
        waiter.close()
        if lease is not None:
            lease.release()


@pytest.mark.timeout(30)
def test_the_keeper_finds_prctl_loaded_and_never_dlopens_after_the_fork(tmp_path: Path) -> None:
    # A fork of a threaded process (a runner is a thread of its caller) must
    # not dlopen: another thread may hold the loader's lock at the fork, and
    # the keeper would hang before its wait. A standby keeper, forked before
    # its runner's first report loaded prctl, loaded it itself. In a fresh
    # interpreter: prctl is loaded by spawn, before the fork.
    import subprocess
    import sys

    code = ("import os, sys; from slotq.host import keeper, process\n"
            "assert keeper._prctl is None\n"
            "null = os.open(os.devnull, os.O_WRONLY)\n"
            "plan = process.KeeperPlan(process.Command(['true']), process.Streams(null, os.dup(null)))\n"
            "child = process.spawn(plan)\n"
            "loaded = keeper._prctl is not None\n"
            "os.waitpid(child.keeper_pid, 0)\n"
            "sys.exit(0 if loaded else 3)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(30)
def test_an_orphan_is_found_though_its_short_lived_children_go_during_the_scan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a busy machine the scan of every process's descriptors takes a
    # while: a `sleep` of the orphan's loop, seen holding the slot's lock,
    # was gone by the time its environment was read, and the orphan looked
    # like two runs (none healed: a quiet head then looks again only after
    # a report period). A holder gone since the scan holds nothing.
    from slotq.host import orphans

    real = orphans.lock_holders

    def slow_scan(path: str) -> dict[int, int]:
        found = real(path)
        time.sleep(0.06)  # sleep-ok: the time a busy machine's scan takes, after the holders were noted
        return found

    monkeypatch.setattr(orphans, "lock_holders", slow_scan)
    slot = tmp_path / "slot"
    slot.touch()
    fd = os.open(slot, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.set_inheritable(fd, True)
    loop = subprocess.Popen(["sh", "-c", "while :; do sleep 0.05; done"], pass_fds=(fd,), start_new_session=True,
                            env=dict(os.environ, SLOTQ_RUN_ID="abc123"))
    os.close(fd)
    try:
        wait_for(lambda: len(real(str(slot))) >= 2, what="the loop and a sleep of it holding the lock")
        found = [orphans.orphan_in_slot(str(slot)) for _ in range(20)]
        assert all(f is not None and f[0] == "abc123" for f in found), found
    finally:
        os.killpg(loop.pid, signal.SIGKILL)
        loop.wait()
