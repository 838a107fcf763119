"""Supervision that survives kills and truthful holders, end to end
through the installed CLI, real processes (`slotq cancel` and admission:
test_cancel_admission.py)."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import alive, blocked_in_flock, group_alive, slotq_cmd, wait_for
from slotq import history
from conftest import (Start, children, gate_cmd, holder_record, live_tickets, second_user_slotq, slot_held_here,
                      slot_holder, start_holder, status_json)

TERM_IGNORING = "trap '' TERM HUP; echo $$ > {pidf}; sleep 300 & sleep 300"
PGROUP = Path(__file__).with_name("pgroup.py")


def start_caller(args: list[str], tmp: Path, name: str) -> subprocess.Popen[bytes]:
    """`slotq run` in a process group of its own, as a harness starts a job."""
    return subprocess.Popen(slotq_cmd() + ["run", "--json", str(tmp / f"{name}.json")] + args,
                            stdin=subprocess.DEVNULL, stdout=open(tmp / f"{name}.out", "wb"),
                            stderr=open(tmp / f"{name}.err", "wb"), cwd=tmp, start_new_session=True)


def history_of(state_dir: Path, run_id: str) -> list[dict[str, object]]:
    return [h for h in history.recent(str(state_dir), 50) if h.get("run_id") == run_id]


def shared_slot() -> dict[str, Any]:
    return dict(next(p for p in status_json()["pools"] if p["pool"] == "shared")["slots"][0])


@pytest.mark.timeout(40)
def test_group_sigkill_of_a_running_caller_ends_its_command_before_the_next_starts(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # What a harness does on timeout: kill -9 -PGID. The keeper is not in
    # that group, so it survives, sees its runner gone, and ends the command.
    pidf = tmp_path / "pgid"
    caller = start_caller(["--budget", "3", "--kill-grace", "1", "--", "sh", "-c",
                           TERM_IGNORING.format(pidf=pidf)], tmp_path, "first")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="command running")
    pgid = int(pidf.read_text())
    run_id = holder_record(state_dir)["run_id"]
    nxt = runs("--", sys.executable, str(PGROUP), str(pgid), name="next")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="next in line")
    t0 = time.monotonic()
    os.killpg(caller.pid, signal.SIGKILL)
    caller.wait()
    # While the keeper ends the command the holder is `stopping`, never a
    # dead pid shown as `running`.
    phases = set()
    while group_alive(pgid) and time.monotonic() - t0 < 1 + 2:
        slot = shared_slot()
        if slot.get("run_id") == run_id:
            phases.add(slot.get("phase"))
    assert not group_alive(pgid), "the command outlived kill-grace + 2 s"
    assert time.monotonic() - t0 <= 1 + 2
    assert phases == {"stopping"}, phases
    assert nxt.wait() == 0
    assert nxt.out == b"clean\n"  # the next command started only after the group was gone
    # The keeper writes the history line after the command is gone.
    [line] = wait_for(lambda: history_of(state_dir, run_id), what="the killed run's history line")
    assert line["outcome"] == "caller_gone"


@pytest.mark.timeout(40)
def test_a_killed_supervisor_is_unavailable_not_a_failure_of_the_work(
        state_dir: Path, tmp_path: Path) -> None:
    # The command would exit 0 (once the gate opens); its keeper is killed
    # under it. The runner notices at once, ends the command itself, and
    # blames the infrastructure.
    gate = tmp_path / "gate"
    pidf = tmp_path / "pgid"
    caller = start_caller(["--budget", "60", "--kill-grace", "1", "--", "sh", "-c",
                           f'echo $$ > {pidf}; {" ".join(gate_cmd(gate)[:2])} "{gate_cmd(gate)[2]}"; exit 0'],
                          tmp_path, "run")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="command running")
    pgid = int(pidf.read_text())
    keeper = holder_record(state_dir)["keeper"]
    os.kill(keeper, signal.SIGKILL)
    assert caller.wait(timeout=10) == 121
    res = json.loads((tmp_path / "run.json").read_text())
    assert res["outcome"] == "unavailable" and res["blame"] == "infrastructure"
    assert f"supervisor (slotq keeper, pid {keeper}) was killed after the command started" in res["message"]
    assert not group_alive(pgid)
    wait_for(lambda: slot_holder(state_dir) is None, timeout=2, what="slot free")


@pytest.mark.timeout(40)
def test_a_killed_supervisor_of_a_term_ignoring_command_frees_the_slot_within_grace(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    pidf = tmp_path / "pgid"
    t0 = time.monotonic()
    caller = start_caller(["--budget", "3", "--kill-grace", "1", "--", "sh", "-c", TERM_IGNORING.format(pidf=pidf)],
                          tmp_path, "run")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="command running")
    pgid = int(pidf.read_text())
    keeper = holder_record(state_dir)["keeper"]
    nxt = runs("--", sys.executable, str(PGROUP), str(pgid), name="next")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="next in line")
    os.kill(keeper, signal.SIGKILL)
    assert caller.wait(timeout=10) == 121
    assert not group_alive(pgid)
    assert time.monotonic() - t0 <= 3 + 1 + 2  # budget + grace + 2 s at the very most
    assert nxt.wait() == 0 and nxt.out == b"clean\n"


@pytest.mark.timeout(40)
def test_a_killed_standby_keeper_ends_the_wait_unavailable_and_the_line_moves_up(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    log = tmp_path / "log"
    start_holder(runs, state_dir, gate)
    first = runs("--", "sh", "-c", f"echo first >> {log}", name="first")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="first in line")
    second = runs("--", "sh", "-c", f"echo second >> {log}", name="second")
    wait_for(lambda: len(live_tickets(state_dir)) == 2, what="second in line")
    [keeper] = wait_for(lambda: children(first.proc.pid), what="the first waiter's keeper")
    os.kill(keeper, signal.SIGKILL)
    assert first.wait() == 121
    res = first.result()
    assert res["outcome"] == "unavailable"
    assert "was killed before the command started; nothing ran" in res["message"]
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="only the second in line")
    gate.touch()
    assert second.wait() == 0
    assert log.read_text().split() == ["second"]


def orphan(state_dir: Path, tmp_path: Path, slotq: list[str] | None = None,
           user: str | None = None, command: str = TERM_IGNORING, grace: str = "1") -> tuple[int, str]:
    """A holder whose runner and keeper are both SIGKILLed by pid, leaving
    its command (TERM-ignoring by default) holding the slot. Returns (pgid,
    run id)."""
    pidf = tmp_path / "orphan-pgid"
    cmd = (slotq or slotq_cmd()) + ["run", "-q", "--budget", "600", "--kill-grace", grace, "--", "sh", "-c",
                                    command.format(pidf=pidf)]
    # As the other user: setuid in the child itself (runuser would stop
    # itself when we stop its child, and never exit).
    who = pwd.getpwnam(user) if user else None
    caller = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=tmp_path,
                              start_new_session=True, user=who.pw_uid if who else None,
                              group=who.pw_gid if who else None, extra_groups=[] if who else None,
                              env=dict(os.environ, HOME=who.pw_dir) if who else None)
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="command running")
    rec = holder_record(state_dir)
    runner = int(rec["pid"])
    os.kill(runner, signal.SIGSTOP)  # it must not see its keeper go
    os.kill(int(rec["keeper"]), signal.SIGKILL)
    os.kill(runner, signal.SIGKILL)
    caller.wait()
    wait_for(lambda: not alive(int(rec["keeper"])), what="keeper gone")
    return int(pidf.read_text()), str(rec["run_id"])


@pytest.mark.timeout(40)
@pytest.mark.parametrize("quiet", [False, True])  # -q too: its first report, at the head, heals
def test_when_runner_and_supervisor_both_die_the_next_head_ends_the_orphan(
        state_dir: Path, runs: Start, tmp_path: Path, quiet: bool) -> None:
    pgid, run_id = orphan(state_dir, tmp_path)
    assert group_alive(pgid)
    slot = shared_slot()
    assert slot["phase"] == "orphaned" and slot["orphan_pids"]
    text = subprocess.run(slotq_cmd() + ["status"], capture_output=True, text=True, timeout=20).stdout
    assert f"held by orphaned processes of user {pwd.getpwuid(os.getuid()).pw_name}" in text
    assert group_alive(pgid), "status must only report, never kill"
    nxt = runs(*(["-q"] if quiet else []), "--report-every", "1", "--", sys.executable, str(PGROUP), str(pgid),
               name="next")
    assert nxt.wait(timeout=20) == 0
    assert nxt.out == b"clean\n"
    assert not group_alive(pgid)
    if not quiet:
        assert f"ended the orphaned command of run {run_id}" in nxt.err
    [line] = history_of(state_dir, run_id)
    assert line["outcome"] == "caller_gone" and "ended by the next in line" in str(line["message"])
    # The record's every field, from the holder record (issue 66: this line
    # had no slot, ticket or budget).
    assert line["slot"] == "shared#0" and line["pool"] == "shared" and line["budget"] == 600.0, line
    assert isinstance(line["ticket"], int) and "kept" in line and line["kept"] is None, line


@pytest.mark.timeout(40)
def test_an_orphans_command_gets_its_kill_grace_to_clean_up(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # TERM, then the run's own --kill-grace before KILL, also when the one
    # ending the command is the next head and not the run's keeper: the
    # command's TERM handler takes a moment, then leaves a mark. (Its output
    # goes nowhere: an orphan's stdout and stderr have no reader left, so
    # any write -- the shell's "Terminated" for the handler's sleep -- would
    # end it by SIGPIPE.)
    done = tmp_path / "cleaned"
    cleans_up = (f"exec >/dev/null 2>&1; trap 'sleep 0.3; echo cleaned > {done}; exit 0' TERM; echo $$ > {{pidf}}; "
                 "sleep 300 & wait")
    pgid, run_id = orphan(state_dir, tmp_path, command=cleans_up, grace="10")
    nxt = runs("-q", "--", "true", name="next")
    assert nxt.wait(timeout=30) == 0
    assert done.read_text() == "cleaned\n", "the orphan's command was killed before its grace"
    assert not group_alive(pgid)
    [line] = history_of(state_dir, run_id)
    assert line["outcome"] == "caller_gone"


@pytest.mark.timeout(40)
def test_an_orphans_line_is_written_even_if_the_head_ending_it_is_killed(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    """The head that ends an orphan gives its command the run's grace, and
    a waiting head can be killed meanwhile (the chaos run found it: a
    killed run with no history line). The line was written after the end,
    so nobody wrote it: the next head found no orphan left."""
    mark = tmp_path / "termed"
    stays = (f"exec >/dev/null 2>&1; trap 'echo t > {mark}' TERM; echo $$ > {{pidf}}; "
             "while :; do sleep 0.05; done")
    pgid, run_id = orphan(state_dir, tmp_path, command=stays, grace="30")
    try:
        head = runs("-q", "--", "true", name="head")
        wait_for(mark.exists, timeout=20, what="the head ending the orphan (its TERM)")
        for pid in [*children(head.proc.pid), head.proc.pid]:  # its keeper, then itself
            os.kill(pid, signal.SIGKILL)
        head.proc.wait()
        [line] = wait_for(lambda: history_of(state_dir, run_id), timeout=5, what="the orphan's history line")
        assert line["outcome"] == "caller_gone" and "ended by" in str(line["message"])
        assert group_alive(pgid)  # its grace was not over: the next head ends it
    finally:
        for pid in __import__("pgroup").members(pgid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(40)
def test_a_quiet_head_ends_a_holder_orphaned_while_it_waits(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # A quiet run makes no reports behind others, but at the head it goes
    # on reporting -- those reports are what end an orphaned holder. Here
    # the holder is orphaned only after the quiet run's first report (its
    # keeper already waits for the slot), so only a later one can end it.
    pidf = tmp_path / "pgid"
    holder = start_caller(["-q", "--budget", "600", "--kill-grace", "1", "--", "sh", "-c",
                           TERM_IGNORING.format(pidf=pidf)], tmp_path, "holder")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="command running")
    pgid = int(pidf.read_text())
    rec = holder_record(state_dir)
    nxt = runs("-q", "--report-every", "0.5", "--", sys.executable, str(PGROUP), str(pgid), name="next")
    keeper = wait_for(lambda: children(nxt.proc.pid), what="the quiet run's keeper")[0]
    wait_for(lambda: blocked_in_flock(keeper), what="its keeper waiting for the slot")
    os.kill(int(rec["pid"]), signal.SIGSTOP)  # the holder's runner must not see its keeper go
    os.kill(int(rec["keeper"]), signal.SIGKILL)
    os.kill(int(rec["pid"]), signal.SIGKILL)
    holder.wait()
    try:
        assert nxt.wait(timeout=20) == 0
    finally:
        if group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)  # not ended: the orphan must not outlive the test
    assert nxt.out == b"clean\n"
    [line] = history_of(state_dir, str(rec["run_id"]))
    assert line["outcome"] == "caller_gone" and "ended by the next in line" in str(line["message"])



@pytest.mark.timeout(40)
def test_another_users_orphan_is_named_not_touched(shared_state: Path, tmp_path: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="slotq-orphan-", dir=shared_state.parent))
    os.chmod(work, 0o777)
    pgid, run_id = orphan(shared_state, work, second_user_slotq(), user="slotqtest")
    assert group_alive(pgid)
    err = tmp_path / "next.err"
    nxt = subprocess.Popen(slotq_cmd() + ["run", "--report-every", "0.5", "--", "true"], stdin=subprocess.DEVNULL,
                           stderr=open(err, "wb"), cwd=tmp_path)
    try:
        wait_for(lambda: "held by orphaned processes of user slotqtest" in err.read_text(), timeout=10,
                 what="the waiter's status line naming the orphan and its user")
        wait_for(lambda: err.read_text().count("slotq: waiting") >= 3, timeout=10, what="two more reports")
        assert group_alive(pgid), "another user's processes must not be touched"
        assert shared_slot()["orphan_user"] == "slotqtest"
        assert history_of(shared_state, run_id) == [], "no line may say the orphan was ended"
        assert "ended the orphaned command" not in err.read_text()
    finally:
        for pid in __import__("pgroup").members(pgid):
            os.kill(pid, signal.SIGKILL)
    assert nxt.wait(timeout=20) == 0


@pytest.mark.timeout(30)
def test_a_slot_just_taken_by_a_new_holder_is_starting_not_orphaned(state_dir: Path) -> None:
    # At every hand-over, for a few ms, the new holder has the slot's lock
    # while the record is still its predecessor's, whose runner and keeper
    # are gone. That is no orphan: status says `starting` (showing nothing
    # of the old record), and the head's healing ends nothing -- nor
    # searches /proc for the old run's processes.
    from slotq.host.orphans import heal_slots

    gone = subprocess.Popen(["true"])
    gone.wait()
    with slot_held_here(state_dir) as lease:
        lease.record(run_id="feedc0de", label="the previous run", pid=gone.pid, pid_start=1, keeper=gone.pid,
                     keeper_start=1, cmd=gone.pid, cmd_start=1, since=time.time(), phase="running")
        slot = shared_slot()
        assert slot["phase"] == "starting", slot
        assert "orphan_pids" not in slot and slot.get("run_id") is None and slot.get("label") is None
        text = subprocess.run(slotq_cmd() + ["status"], capture_output=True, text=True, timeout=20).stdout
        assert "shared#0: just taken by pid" in text and "orphan" not in text and "previous run" not in text
        assert heal_slots(str(state_dir), "shared", 1, 1.0, set(), by="the test") == []


@pytest.mark.timeout(30)
def test_a_holder_whose_pid_another_process_now_has_is_not_running(state_dir: Path) -> None:
    # pids are reused: a holder's runner (or keeper) counts as alive only
    # if the process that has its pid now started when it did. The record
    # names this live process, which holds the slot's lock: with its own
    # start time it is the running holder; with another start time it is
    # a runner and keeper that are gone.
    from slotq.procinfo import start_ticks

    me, started = os.getpid(), start_ticks(os.getpid())
    assert started is not None
    with slot_held_here(state_dir) as lease:
        lease.record(run_id="feedc0de", label="the run", pid=me, pid_start=started, since=time.time(),
                     phase="running")
        assert shared_slot()["phase"] == "running"
        lease.record(pid_start=started - 1, keeper=me, keeper_start=started - 1)
        slot = shared_slot()
        assert slot["phase"] == "orphaned" and slot["orphan_pids"] == [], slot


@pytest.mark.timeout(40)
def test_a_holder_after_a_longer_ones_record_reads_as_its_own_and_the_file_never_shrinks(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Holder records are rewritten in place padded with spaces, never
    # truncated (a journalled truncate cost 0.2-0.6 ms of every start).
    long_label = "a-long-label-" + "x" * 300
    assert runs("-q", "--label", long_label, "--", "true").wait() == 0
    slot_file = state_dir / "slots" / "shared.0"
    size = slot_file.stat().st_size
    assert size > 300
    gate = tmp_path / "gate"
    holder = runs("-q", "--label", "short", "--", *gate_cmd(gate), name="short")
    rec = holder_record(state_dir)
    assert rec["label"] == "short" and rec["phase"] == "running" and rec["cmd"]
    assert shared_slot()["label"] == "short"  # and `slotq status` reads it so
    assert slot_file.stat().st_size == size  # padded to the longer record's size
    raw = slot_file.read_bytes()
    assert raw.rstrip(b" ").endswith(b"}") and raw.endswith(b" ")
    gate.touch()
    assert holder.wait() == 0


def test_a_holder_record_file_larger_than_a_record_is_cut_to_the_new_one(tmp_path: Path) -> None:
    from slotq.host.slot import MAX_RECORD, write_record

    path = tmp_path / "slot"
    path.write_bytes(b" " * (MAX_RECORD + 10))  # not one of ours: never padded up to
    fd = os.open(path, os.O_RDWR)
    try:
        write_record(fd, b'{"phase":"running"}')
    finally:
        os.close(fd)
    assert path.read_bytes() == b'{"phase":"running"}'
