"""A line of real `slotq run`s: order kept (a SIGKILLed waiter skipped),
never two in the slot, the ticket taken before the client and runner load,
and each waiter of a one-slot line waiting in its keeper, in flock(2)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import (Start, blocked_in_flock, children, fd_targets, first_waited, line_up, live_tickets,
                      one_waiting_ahead, run_in_thread, slotq_cmd, spool_ops, start_holder, wait_for)
from slotq.client.caller import run
from slotq.errors import UsageError
from slotq.host.line import list_tickets, pool_dir, probe
from slotq.spec import RunSpec
from slotq.transports.local import LocalTransport


def test_order_is_fifo_and_a_sigkilled_waiter_does_not_block(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    log = tmp_path / "order"
    start_holder(runs, state_dir, gate)
    waiters = line_up(runs, state_dir, [f"echo {i} >> {log}" for i in range(5)])
    waiters[2].kill()
    wait_for(lambda: len(live_tickets(state_dir)) == 4, timeout=1.0, what="killed waiter's ticket gone")
    gate.touch()
    for i in (0, 1, 3, 4):
        assert waiters[i].wait() == 0
    assert log.read_text().split() == ["0", "1", "3", "4"]


@pytest.mark.timeout(30)
def test_commands_of_a_line_never_overlap_and_start_in_order(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Every waiter waits in a standby keeper: each command
    # must hold the slot (the inherited lock) until its last process exits,
    # so the next starts only then -- also when it lingers a little.
    gate = tmp_path / "gate"
    log = tmp_path / "log"
    start_holder(runs, state_dir, gate)
    # sleep-ok: the command's own lingering, which the next must wait out
    waiters = line_up(runs, state_dir, [f'echo "S $(date +%s%N) {i}" >> {log}; sleep 0.05; '
                                        f'echo "E $(date +%s%N) {i}" >> {log}' for i in range(5)])
    gate.touch()
    for w in waiters:
        assert w.wait() == 0
    events = sorted((int(t), kind, int(i)) for kind, t, i in (line.split() for line in log.read_text().splitlines()))
    assert [(kind, i) for _, kind, i in events] == [(k, i) for i in range(5) for k in ("S", "E")]


# A run joins the line before the client and the runner are loaded
# (LocalTransport.reserve): its ticket marks when the caller arrived. At the
# head of its line with its slot free, it starts its command once the client
# is loaded (LocalTransport.start_early): the keeper's fork comes before the
# runner's import.

AUDIT_ORDER = """
import os, runpy, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
def hook(event, args):
    if event == "os.link" and str(args[1]).endswith(".t"):
        os.write(fd, b"ticket\\n")
    elif event == "import" and args[0] in ("slotq.client.caller", "slotq.host.runner"):
        os.write(fd, args[0].encode() + b"\\n")
    elif event == "os.fork":
        os.write(fd, b"fork\\n")
sys.addaudithook(hook)
script = sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.timeout(30)
def test_slotq_run_takes_its_ticket_before_loading_the_client_and_the_runner(state_dir: Path, tmp_path: Path) -> None:
    assert subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, timeout=20).returncode == 0
    events = tmp_path / "events"
    # Python's audit hooks see the ticket's link(2) and each import as it happens.
    proc = subprocess.run([sys.executable, "-c", AUDIT_ORDER, str(events), *slotq_cmd(), "run", "-q", "--", "true"],
                          cwd=tmp_path, timeout=20)
    assert proc.returncode == 0
    # Its slot was free: the command's keeper was forked before the runner loaded.
    assert events.read_text().split() == ["ticket", "slotq.client.caller", "fork", "slotq.host.runner"]


@pytest.mark.timeout(30)
def test_a_run_whose_slot_is_taken_starts_nothing_before_its_runner(state_dir: Path, runs: Start,
                                                                     tmp_path: Path) -> None:
    gate, events, log = tmp_path / "gate", tmp_path / "events", tmp_path / "log"
    start_holder(runs, state_dir, gate)
    proc = subprocess.Popen([sys.executable, "-c", AUDIT_ORDER, str(events), *slotq_cmd(), "run", "-q", "--",
                             "sh", "-c", f"echo ran >> {log}"], cwd=tmp_path, stdin=subprocess.DEVNULL)
    try:
        # Open the gate only once the run has looked at its slot and gone its
        # way (four events: its runner loaded, a keeper forked). A gate opened
        # as soon as its ticket shows lets a run still loading on a busy
        # machine find the slot free -- rightly -- and start at once.
        wait_for(lambda: events.exists() and len(events.read_text().split()) >= 4, what="the run's look at its slot")
        assert not log.exists() and len(live_tickets(state_dir)) == 1
        gate.touch()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # In line, it forks its keeper once its runner is there (a standby keeper).
    assert events.read_text().split() == ["ticket", "slotq.client.caller", "slotq.host.runner", "fork"]
    assert log.read_text() == "ran\n"


@pytest.mark.timeout(30)
def test_a_run_started_at_once_whose_keeper_cannot_fork_has_its_runner_try_again(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slotq.host import launch, process

    assert subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, timeout=20).returncode == 0
    forks: list[str] = []

    def spawn(plan: Any) -> Any:
        forks.append(threading.current_thread().name)
        if len(forks) == 1:  # the start at once (reserve): no process to spare
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return process.spawn(plan)

    monkeypatch.setattr(launch, "spawn", spawn)
    out = tmp_path / "out"
    transport = LocalTransport()
    spec = RunSpec(["sh", "-c", f"echo ran > {out}"], budget=30, cwd=str(tmp_path), quiet=True)
    transport.reserve(spec)
    transport.start_early(spec)
    assert forks == [threading.current_thread().name]
    with open(state_dir / "slots" / "shared.0", "rb") as slot:  # leased by the start at once all the same
        with pytest.raises(BlockingIOError):
            fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
    result = run(spec, transport)
    assert result.exit_code == 0 and out.read_text() == "ran\n"
    assert len(forks) == 2 and forks[1] != forks[0]  # the runner's thread tried again


@pytest.mark.timeout(30)
def test_a_run_found_in_line_before_its_runner_loads_lists_the_line_once(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slotq.host import hostqueue, line

    gate, log = tmp_path / "gate", tmp_path / "log"
    start_holder(runs, state_dir, gate)
    line_up(runs, state_dir, [f"echo ahead >> {log}"])
    listings: list[str] = []
    real_ahead_entries = line.ahead_entries

    def ahead_entries(pdir: str, path: str) -> list[line.Entry]:
        listings.append(path)
        return real_ahead_entries(pdir, path)

    monkeypatch.setattr(hostqueue, "ahead_entries", ahead_entries)
    transport = LocalTransport()
    spec = RunSpec(["sh", "-c", f"echo me >> {log}"], budget=30, cwd=str(tmp_path), quiet=True)
    transport.reserve(spec)
    transport.start_early(spec)  # in line: nothing starts; its first look is taken
    assert len(listings) == 1 and not log.exists()
    before = set(children(os.getpid()))
    t, results = run_in_thread(spec, transport)
    wait_for(lambda: set(children(os.getpid())) - before, what="its standby keeper")  # the runner waits
    gate.touch()
    t.join(20)
    assert results and results[0].exit_code == 0
    assert log.read_text().split() == ["ahead", "me"]
    assert len(listings) == 1  # the runner waited with the waiter that looked first


@pytest.mark.timeout(30)
def test_a_ticket_taken_before_the_runner_starts_keeps_its_place(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate, log = tmp_path / "gate", tmp_path / "order"
    start_holder(runs, state_dir, gate)
    early = LocalTransport()
    spec = RunSpec(["sh", "-c", f"echo early >> {log}"], budget=30, cwd=str(tmp_path), quiet=True)
    early.reserve(spec)
    assert early.queued_since is not None
    [(seq, _)] = [(s, p) for s, p in list_tickets(pool_dir(str(state_dir), "shared")) if probe(p)]
    # A caller that arrives later, and whose runner is under way first.
    later = runs("-q", "--", "sh", "-c", f"echo later >> {log}", name="later")
    wait_for(lambda: len(live_tickets(state_dir)) == 2, what="the later caller in line")
    t, results = run_in_thread(spec, early)
    wait_for(lambda: first_waited(state_dir) > 0, what="the early run's runner waiting")
    assert len(live_tickets(state_dir)) == 2  # the runner took no second ticket
    gate.touch()
    assert later.wait() == 0
    t.join(20)
    assert results and results[0].exit_code == 0
    assert results[0].ticket == seq
    assert log.read_text().split() == ["early", "later"]


@pytest.mark.timeout(30)
def test_a_reserved_ticket_is_withdrawn_when_the_run_never_queues(state_dir: Path, tmp_path: Path) -> None:
    assert subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, timeout=20).returncode == 0
    transport = LocalTransport()
    spec = RunSpec(["true"], budget=30, cwd=str(tmp_path / "gone"))
    transport.reserve(spec)
    assert len(live_tickets(state_dir)) == 1
    with pytest.raises(UsageError, match="not a directory"):
        run(spec, transport)
    wait_for(lambda: not list_tickets(pool_dir(str(state_dir), "shared")), what="the reserved ticket withdrawn")


@pytest.mark.timeout(30)
def test_an_early_ticket_is_never_waited_for(state_dir: Path, tmp_path: Path) -> None:
    from slotq.config import HostConfig
    from slotq.host.ticket import run_info, take_early

    spec = RunSpec(["true"], budget=30, cwd=str(tmp_path))
    info = run_info(spec, HostConfig.load(), time.time())
    # No state directory yet: the runner makes it (and says if it cannot).
    assert take_early(str(state_dir), "shared", info) is None
    assert not state_dir.exists()
    assert subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, timeout=20).returncode == 0
    # The ticket counter held by someone: back after `patience`, no ticket.
    with open(state_dir / "seq") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        t0 = time.monotonic()
        assert take_early(str(state_dir), "shared", info, patience=0.1) is None
        assert time.monotonic() - t0 < 2.0
    # The admission limit reached: no ticket (the runner says not_admitted).
    ticket = take_early(str(state_dir), "shared", info)
    assert ticket is not None
    try:
        assert take_early(str(state_dir), "shared", info, (1, None)) is None
    finally:
        ticket.withdraw()
    assert not list_tickets(pool_dir(str(state_dir), "shared"))


@pytest.mark.timeout(30)
def test_a_waiter_behind_others_on_a_new_state_dir_waits_for_a_slot_file_nobody_made_yet(
        state_dir: Path, runs: Start) -> None:
    # Slot files are made on first use, by the head. On a new state dir a
    # run queued behind a ticket whose run never reached the head yet (a
    # burst of first runs) has its keeper wait on a slot file that is not
    # there: it must make it, not end the run `unavailable`.
    from slotq.host.hostqueue import ensure_state_dir
    from slotq.host.ticket import take_ticket

    ensure_state_dir(str(state_dir))
    ahead = take_ticket(str(state_dir), "shared", {"run_id": "ahead", "label": "ahead"})
    slot_file = state_dir / "slots" / "shared.0"
    try:
        assert not slot_file.exists()
        waiter = runs("-q", "--", "true")
        wait_for(lambda: waiter.proc.poll() is not None or any(blocked_in_flock(p) for p in children(waiter.proc.pid)),
                 what="the waiter's keeper blocked in flock, or the waiter ended")
        assert waiter.proc.poll() is None, waiter.err
    finally:
        ahead.withdraw()
    assert waiter.wait() == 0, waiter.err
    assert slot_file.exists()


@pytest.mark.timeout(30)
def test_every_waiter_of_a_one_slot_line_waits_in_its_keeper_in_flock(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Like flock(1): the kernel keeps the line. Each waiter's keeper is
    # blocked in flock(2) -- on the ticket ahead, or on the slot at the
    # head -- and the waiters' own processes watch nothing.
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    waiters = line_up(runs, state_dir, ["true"] * 3)
    keepers = [wait_for(lambda w=w: children(w.proc.pid), what="a keeper") for w in waiters]  # type: ignore[misc]
    assert all(len(k) == 1 for k in keepers)
    wait_for(lambda: all(blocked_in_flock(k[0]) for k in keepers), what="every keeper blocked in flock(2)")
    assert not any("anon_inode:inotify" in fd_targets(w.proc.pid) for w in waiters)
    gate.touch()
    assert [w.wait() for w in waiters] == [0, 0, 0]


@pytest.fixture
def keeper_fork_refused(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No process to spare for a standby keeper in this process's runners
    (EAGAIN at its fork); the list gets the slot each was refused for."""
    from slotq.host import launch, process

    refused: list[str] = []
    real_spawn = process.spawn

    def spawn(plan: Any) -> Any:
        if plan.standby is not None:  # the standby keeper's fork, only
            refused.append(plan.standby.lock_path)
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real_spawn(plan)

    monkeypatch.setattr(launch, "spawn", spawn)
    return refused


@pytest.mark.timeout(30)
def test_a_waiter_that_cannot_fork_its_keeper_waits_by_itself(
        state_dir: Path, runs: Start, tmp_path: Path, keeper_fork_refused: list[str]) -> None:
    # No process to spare for the keeper (EAGAIN at the fork): the run keeps
    # its ticket and its place, and waits for the slot in its own process.
    refused = keeper_fork_refused
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    out_r, out_w = os.pipe()
    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(
        run(RunSpec(["echo", "ran"], budget=30, cwd=str(tmp_path)), LocalTransport(), stdout_fd=out_w)))
    t.start()
    wait_for(lambda: refused, what="the keeper's fork refused")
    assert len(live_tickets(state_dir)) == 1  # still in line
    gate.touch()
    t.join(timeout=20)
    os.close(out_w)
    assert results and results[0].outcome.value == "passed", results
    assert os.read(out_r, 100) == b"ran\n"
    assert len(refused) == 1


@pytest.mark.timeout(30)
def test_a_quiet_waiter_whose_keeper_cannot_fork_refreshes_its_wait_record_itself(
        state_dir: Path, runs: Start, tmp_path: Path, keeper_fork_refused: list[str]) -> None:
    # Far back and quiet, the run was told its keeper would close its wait
    # record if it died; the keeper's fork then failed. Nobody would: the
    # runner says so, and the caller refreshes the record as it waits.
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    one_waiting_ahead(runs, state_dir)
    ledger = str(tmp_path / "ledger.sqlite")
    spec = RunSpec(["true"], budget=30, cwd=str(tmp_path), quiet=True)
    t, results = run_in_thread(spec, heartbeat_every=0.02, ledger_path=ledger)
    wait_for(lambda: keeper_fork_refused, what="the keeper's fork refused")
    wait_for(lambda: len(spool_ops(ledger, f"{spec.run_id}:queue", "beat")) >= 5, what="the record refreshed")
    gate.touch()
    t.join(timeout=20)
    assert results and results[0].outcome.value == "passed", results
