"""Waiting away (host/away.py): a quiet local run far back in a slow
one-slot line waits as a shell and flock(1), at a fraction of an
interpreter's memory, and comes back before its turn -- in its place, with
its run id, its wait record and its clocks; a stop signal, `slotq cancel`,
--max-wait and a `kill -9` of its group while away end it as they end any
waiting run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import Run, Start, live_tickets, slotq_cmd, spool_ops, start_holder, wait_for
from slotq import history
from slotq.host.away import AWAY_AHEAD, away_pid

pytestmark = pytest.mark.timeout(60)


def seed_history(state_dir: Path, ran_s: float = 60.0, runs: int = 3) -> None:
    """The pool's history says its runs take `ran_s`: a slow line."""
    state_dir.mkdir(exist_ok=True)
    now = time.time() - 3600
    for i in range(runs):
        history.append(str(state_dir), history.run_record(
            run_id=f"seed{i}", label="seed", cls="shared", host="h", outcome="passed", exit_code=0, message="",
            pool="shared", phases={"submitted": now, "slot": now, "started": now, "ended": now + ran_s},
            slot=None, ticket=None, budget=None, kept=None))


def line_of(runs: Start, state_dir: Path, log: Path, n: int, *extra: str) -> list[Run]:
    """`n` quiet runs in line, in this order, each appending its name to `log`."""
    out = []
    for i in range(n):
        out.append(runs("-q", *extra, "--", "sh", "-c", f"echo w{i} >> {log}", name=f"w{i}"))
        wait_for(lambda: len(live_tickets(state_dir)) == i + 1, what=f"w{i} in line")
    return out


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except OSError:
                pass
    return out


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def pss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def ticket_info(state_dir: Path, pid: int) -> dict[str, Any]:
    from slotq.host.line import list_tickets, pool_dir, read_info

    for _, path in list_tickets(pool_dir(str(state_dir), "shared")):
        info = read_info(path) or {}
        if info.get("pid") == pid:
            return info
    return {}


def history_of(state_dir: Path, run_id: str) -> list[dict[str, Any]]:
    return [r for r in history.recent(str(state_dir), 100) if r.get("run_id") == run_id]


def gone_away(run: Run) -> bool:
    return away_pid(run.proc.pid)


@pytest.fixture
def slow_line(state_dir: Path, runs: Start, tmp_path: Path) -> Iterator[Path]:
    """A pool whose history says it is slow, its slot held (until the test
    ends) and AWAY_AHEAD + 1 quiet runs in line, each appending its name to
    the log this yields: the next quiet run goes away."""
    seed_history(state_dir)
    gate, log = tmp_path / "gate", tmp_path / "log"
    start_holder(runs, state_dir, gate)
    line_of(runs, state_dir, log, AWAY_AHEAD + 1)
    yield log
    gate.touch()


def release_and_see_the_others_run(tmp_path: Path, log: Path) -> None:
    (tmp_path / "gate").touch()
    wait_for(lambda: len(log.read_text().split()) == AWAY_AHEAD + 1 if log.exists() else False,
             what="the others ran")


def test_a_quiet_run_far_back_in_a_slow_line_waits_as_a_shell_and_runs_in_its_turn(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    seed_history(state_dir)
    gate, log = tmp_path / "gate", tmp_path / "log"
    start_holder(runs, state_dir, gate)
    near = line_of(runs, state_dir, log, AWAY_AHEAD + 1, "--credit-dir", str(tmp_path))
    far = runs("-q", "--", "sh", "-c", f"echo far >> {log}; env > {tmp_path / 'far.env'}", name="far")
    wait_for(lambda: gone_away(far), what="the far run waiting away")
    info = ticket_info(state_dir, far.proc.pid)
    assert info.get("run_id"), "its ticket names it, with its own pid"
    # Its two helpers (the sh forks, then execs the flock it waits in).
    # (Named by program and first option: flock is /usr/bin/flock or /bin/flock, as PATH finds it.)
    def named(pid: int) -> str:
        argv = cmdline(pid) or ["?"]
        return " ".join([os.path.basename(argv[0]), *argv[1:2]])

    helpers = wait_for(lambda: h if set(h := {named(p): p for p in children_of(far.proc.pid)})
                       == {"flock -s", "flock -x"} else None, what="its flock and its watcher")
    assert os.getsid(helpers["flock -x"]) != os.getsid(far.proc.pid), "the watcher has a session of its own"
    total = pss_kb(far.proc.pid) + sum(pss_kb(p) for p in helpers.values())
    assert total < 1024, f"a run waiting away is {total} kB (sh, flock and its watcher)"
    for w in near:
        assert not gone_away(w), "the runs near the head keep their interpreter"
    shown = subprocess.run(slotq_cmd() + ["status"], capture_output=True, text=True, timeout=20).stdout
    (line,) = [x for x in shown.splitlines() if f"run {info['run_id']}" in x]
    assert line.startswith(f"  waiting {AWAY_AHEAD + 2}: ") and "[waiting away" in line, line
    assert sum("[waiting away" in x for x in shown.splitlines()) == 1
    gate.touch()
    for w in [*near, far]:
        assert w.wait() == 0, w.err
    assert log.read_text().split() == [f"w{i}" for i in range(AWAY_AHEAD + 1)] + ["far"]
    result = far.result()
    assert result["outcome"] == "passed" and result["run_id"] == info["run_id"]
    assert result["phases"]["submitted"] == pytest.approx(info["since"], abs=0.01), "its wait began when it joined"
    env = (tmp_path / "far.env").read_text()
    assert "SLOTQ_AWAY" not in env and f"SLOTQ_RUN_ID={info['run_id']}" in env
    key = f"{info['run_id']}:queue"
    ledger = os.environ["SLOTQ_LEDGER"]
    assert len(spool_ops(ledger, key, "open")) == 1 and len(spool_ops(ledger, key, "close")) == 1
    assert spool_ops(ledger, key, "close")[0]["end"] == pytest.approx(result["phases"]["slot"], abs=0.5)
    wait_for(lambda: not children_of(far.proc.pid) or far.proc.poll() is not None, what="helpers gone")
    assert not any("slotq host away-gone" in " ".join(cmdline(int(p))) for p in os.listdir("/proc") if p.isdigit())


@pytest.mark.parametrize("why", ["no history", "a fast pool", "not quiet"])
def test_a_run_stays_unless_it_is_quiet_and_its_wait_is_known_to_be_long(
        state_dir: Path, runs: Start, tmp_path: Path, why: str) -> None:
    if why != "no history":
        seed_history(state_dir, ran_s=1.0 if why == "a fast pool" else 60.0)
    gate, log = tmp_path / "gate", tmp_path / "log"
    start_holder(runs, state_dir, gate)
    line_of(runs, state_dir, log, AWAY_AHEAD + 2)
    far = runs(*([] if why == "not quiet" else ["-q"]), "--", "true", name="far")
    # It waits in its standby keeper, a fork of it (the same program).
    wait_for(lambda: any(cmdline(p) == cmdline(far.proc.pid) for p in children_of(far.proc.pid)),
             what="the far run's standby keeper")
    assert not gone_away(far) and cmdline(far.proc.pid)[0] != "sh"
    gate.touch()
    assert far.wait() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_while_away_cancels_the_run(state_dir: Path, runs: Start, tmp_path: Path, sig: int,
                                                  slow_line: Path) -> None:
    far = runs("-q", "--", "sh", "-c", f"echo far >> {slow_line}", name="far")
    wait_for(lambda: gone_away(far), what="the far run waiting away")
    run_id = ticket_info(state_dir, far.proc.pid)["run_id"]
    helpers = children_of(far.proc.pid)
    far.proc.send_signal(sig)
    assert far.wait() == 130
    result = far.result()
    name = "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
    assert result["outcome"] == "cancelled" and f"({name})" in result["message"], result["message"]
    assert [r["outcome"] for r in history_of(state_dir, run_id)] == ["cancelled"]
    assert len(live_tickets(state_dir)) == AWAY_AHEAD + 1, "its place left the line; the others kept theirs"
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in helpers), what="its flock and watcher gone")
    key = f"{run_id}:queue"
    assert spool_ops(os.environ["SLOTQ_LEDGER"], key, "close"), "its wait record was closed"
    release_and_see_the_others_run(tmp_path, slow_line)
    assert "far" not in slow_line.read_text().split()


def test_slotq_cancel_reaches_a_run_waiting_away(state_dir: Path, runs: Start, slow_line: Path) -> None:
    far = runs("-q", "--", "true", name="far")
    wait_for(lambda: gone_away(far), what="the far run waiting away")
    run_id = ticket_info(state_dir, far.proc.pid)["run_id"]
    done = subprocess.run(slotq_cmd() + ["cancel", run_id], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert far.wait() == 130
    assert "cancelled by slotq cancel" in far.result()["message"]


def test_max_wait_while_away_turns_the_run_away_in_time(runs: Start, slow_line: Path) -> None:
    t0 = time.monotonic()
    far = runs("-q", "--max-wait", "3s", "--", "true", name="far")
    wait_for(lambda: gone_away(far), what="the far run waiting away")
    assert far.wait() == 117
    took = time.monotonic() - t0
    result = far.result()
    assert result["outcome"] == "not_admitted" and "--max-wait" in result["message"]
    assert 3.0 <= took < 10.0, f"turned away after {took:.1f}s for --max-wait 3s"


def test_a_kill_of_its_group_while_away_ends_its_wait_then_and_records_it(
        state_dir: Path, runs: Start, tmp_path: Path, slow_line: Path) -> None:
    far = subprocess.Popen(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        wait_for(lambda: away_pid(far.pid), what="the far run waiting away")
        run_id = ticket_info(state_dir, far.pid)["run_id"]
        killed = time.time()
        os.killpg(far.pid, signal.SIGKILL)
        far.wait(timeout=10)
    finally:
        if far.poll() is None:
            far.kill()
            far.wait()
    key = f"{run_id}:queue"
    ledger = os.environ["SLOTQ_LEDGER"]
    wait_for(lambda: spool_ops(ledger, key, "close"), what="its wait record closed by its watcher")
    assert spool_ops(ledger, key, "close")[0]["end"] == pytest.approx(killed, abs=2.0)
    wait_for(lambda: history_of(state_dir, run_id), what="its history line")
    assert [r["outcome"] for r in history_of(state_dir, run_id)] == ["caller_gone"]
    assert len(live_tickets(state_dir)) == AWAY_AHEAD + 1
    release_and_see_the_others_run(tmp_path, slow_line)


def test_a_run_told_it_comes_back_with_a_ticket_not_its_own_is_refused(state_dir: Path, tmp_path: Path) -> None:
    seed_history(state_dir)
    for value, says in ((json.dumps({"fd": 0, "path": str(tmp_path), "watcher": 0}), "is not our ticket"),
                        ("{", "is not JSON"), ('{"fd": 1}', "does not name a ticket")):
        done = subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                              env=dict(os.environ, SLOTQ_AWAY=value), timeout=20)
        assert done.returncode == 64, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot take back the run's place in line" in lines[0] and says in lines[0]


def test_away_gone_leaves_a_live_runs_ticket_alone(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # `slotq host away-gone` is the watcher's: started by anyone else, with a
    # live run's ticket named, it must do nothing to it.
    gate, log = tmp_path / "gate", tmp_path / "log"
    start_holder(runs, state_dir, gate)
    (waiter,) = line_of(runs, state_dir, log, 1)
    (path,) = live_tickets(state_dir)
    run_id = ticket_info(state_dir, waiter.proc.pid)["run_id"]
    gone = json.dumps({"path": path, "fd": 0, "run_id": run_id, "ledger": os.environ["SLOTQ_LEDGER"],
                       "workdir": str(tmp_path), "host": "h"})
    with open(path, "rb") as ticket:
        done = subprocess.run(slotq_cmd() + ["host", "away-gone"], stdin=ticket, capture_output=True, text=True,
                              env=dict(os.environ, SLOTQ_AWAY_GONE=gone), timeout=20)
    assert done.returncode == 1 and "is not held by this watcher: nothing done" in done.stderr
    assert live_tickets(state_dir) == [path] and not history_of(state_dir, run_id)
    assert not spool_ops(os.environ["SLOTQ_LEDGER"], f"{run_id}:queue", "close")
    gate.touch()
    assert waiter.wait() == 0


def test_a_kill_of_the_waiting_shell_alone_frees_its_place_and_its_readers_pipe(
        state_dir: Path, runs: Start, tmp_path: Path, slow_line: Path) -> None:
    # The harness kills the pid only, and reads the run's output to its end:
    # nothing of the run (its flock, its watcher) may keep the pipe open or
    # the place in line.
    import select

    far = subprocess.Popen(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: away_pid(far.pid), what="the far run waiting away")
        run_id = ticket_info(state_dir, far.pid)["run_id"]
        os.kill(far.pid, signal.SIGKILL)
        assert far.stdout is not None and far.stderr is not None
        for stream in (far.stdout, far.stderr):
            ready, _, _ = select.select([stream], [], [], 10)
            assert ready and stream.read() == b"", "end-of-file for the run's reader"
        far.wait(timeout=10)
    finally:
        if far.poll() is None:
            far.kill()
            far.wait()
    wait_for(lambda: history_of(state_dir, run_id), what="its history line")
    assert [r["outcome"] for r in history_of(state_dir, run_id)] == ["caller_gone"]
    assert len(live_tickets(state_dir)) == AWAY_AHEAD + 1
    release_and_see_the_others_run(tmp_path, slow_line)


def test_a_host_can_keep_every_waiting_run_an_interpreter(state_dir: Path, runs: Start, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    seed_history(state_dir)
    config = tmp_path / "host.toml"
    config.write_text('[pools]\nshared = 1\nlanding = 1\n\n[waiting]\naway = "yes"\n')
    monkeypatch.setenv("SLOTQ_CONFIG", str(config))
    done = subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=20)
    assert done.returncode == 78 and done.stderr.count("\n") == 1
    assert "[waiting] takes only away = true or false" in done.stderr
    config.write_text("[pools]\nshared = 1\nlanding = 1\n\n[waiting]\naway = false\n")
    gate, log = tmp_path / "gate", tmp_path / "log"
    start_holder(runs, state_dir, gate)
    line_of(runs, state_dir, log, AWAY_AHEAD + 2)
    far = runs("-q", "--", "true", name="far")
    wait_for(lambda: any(cmdline(p) == cmdline(far.proc.pid) for p in children_of(far.proc.pid)),
             what="the far run's standby keeper")
    assert not gone_away(far)
    gate.touch()
    assert far.wait() == 0


def test_a_stop_signal_the_moment_a_run_goes_away_cancels_it(runs: Start, slow_line: Path) -> None:
    # The signal sent the instant the process has become the shell, before
    # the shell has set its traps: it must wait for them, not kill the run.
    for attempt in range(5):
        far = runs("-q", "--", "true", name=f"far{attempt}")
        end = time.monotonic() + 10
        while not away_pid(far.proc.pid):  # no sleep: the earliest moment
            assert time.monotonic() < end and far.proc.poll() is None, "the far run waiting away"
        far.proc.send_signal(signal.SIGTERM)
        assert far.wait() == 130, f"attempt {attempt}: {far.err}"
        assert far.result()["outcome"] == "cancelled"


def test_a_run_that_comes_back_to_look_while_still_far_back_goes_away_again(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # [waiting] away_look: the ticket a run waits for away may never go, so
    # it comes back to look that often; if still far back it must not stay
    # an interpreter for the rest of the line (a long line's runs all came
    # back at once at the fifth minute: load 500, 10 GB).
    seed_history(state_dir)
    config = tmp_path / "host.toml"
    config.write_text('[pools]\nshared = 1\nlanding = 1\n\n[waiting]\naway_look = "0.5s"\n')
    monkeypatch.setenv("SLOTQ_CONFIG", str(config))
    done = subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=20)
    assert done.returncode == 78 and done.stderr.count("\n") == 1
    assert "[waiting] away_look must be at least 1s" in done.stderr
    config.write_text('[pools]\nshared = 1\nlanding = 1\n\n[waiting]\naway_look = "1s"\n')
    gate, log = tmp_path / "gate", tmp_path / "log"
    start_holder(runs, state_dir, gate)
    line_of(runs, state_dir, log, AWAY_AHEAD + 1)
    far = runs("-q", "--", "sh", "-c", f"echo far >> {log}", name="far")

    def watcher() -> int | None:
        return next((p for p in children_of(far.proc.pid) if cmdline(p)[1:2] == ["-x"]), None) \
            if gone_away(far) else None

    first = wait_for(watcher, what="the far run waiting away")
    info = ticket_info(state_dir, far.proc.pid)
    again = wait_for(lambda: w if (w := watcher()) not in (None, first) else None, timeout=15,
                     what="the far run away again, with a new watcher, after it looked")
    assert again != first and ticket_info(state_dir, far.proc.pid) == info, "the same ticket: its place kept"
    gate.touch()
    assert far.wait() == 0, far.err
    assert log.read_text().split() == [f"w{i}" for i in range(AWAY_AHEAD + 1)] + ["far"]
    assert far.result()["run_id"] == info["run_id"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("line", ["held", "standing_still", "moving", "drained"])
def test_the_waiting_shell_looks_as_often_as_told_and_comes_back_only_then(tmp_path: Path, line: str) -> None:
    # The shell's own loop, its flock a logging stand-in: it waits on the
    # ticket ahead `looks` times and comes back after the last -- or, when
    # the slot is free and its file unchanged over a wait behind a ticket
    # that stays (a line standing still), at that look. Its count was
    # overwritten by the line it read from /proc (`read -r k v`): every run
    # far back came back at its first look (every 10 s, an interpreter
    # each: 100 waiters kept a core busy). And it looks at the slot only
    # then: in a moving line (hand-overs rewrite the slot file) the shared
    # looks of a thousand shells kept the head's keeper from a free slot.
    # Nor in a drained pool: its line stands still on purpose (host/drain.py).
    import fcntl
    import shutil
    import threading

    from slotq.host.away import NAME
    from slotq.transports.away import _SCRIPT

    ahead, slot, own, log, drain = (tmp_path / n for n in ("ahead", "slot", "own", "log", "drain.shared"))
    for f in (ahead, slot, own, *([drain] if line == "drained" else [])):
        f.touch()
    stand_in = tmp_path / "flock"
    stand_in.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {shutil.which("flock")} "$@"\n')
    stand_in.chmod(0o755)
    held = [os.open(ahead, os.O_RDONLY)] + ([os.open(slot, os.O_RDONLY)] if line == "held" else [])
    for fd in held:
        fcntl.flock(fd, fcntl.LOCK_EX)
    fds = (os.open(ahead, os.O_RDONLY), os.open(own, os.O_RDONLY))
    stop = threading.Event()

    def hand_overs() -> None:  # each rewrites the slot file (its mtime: a second on each time)
        t = 1_000_000_000
        while not stop.wait(0.01):
            t += 1
            os.utime(slot, (t, t))

    mover = threading.Thread(target=hand_overs, daemon=True)
    if line == "moving":
        mover.start()

    def place() -> None:
        os.dup2(fds[0], 4)
        os.dup2(fds[1], 5)

    try:
        each = "0.3" if line == "moving" else "0.05"  # (many hand-overs in each wait)
        done = subprocess.run(["sh", "-c", _SCRIPT.format(own=5, ahead=4, run_id="r"), NAME, str(stand_in), each,
                               "4", str(slot), str(drain), "echo", "BACK"], capture_output=True, text=True, timeout=20,
                              preexec_fn=place, pass_fds=(4, 5), stdin=subprocess.DEVNULL)
    finally:
        stop.set()
        for fd in (*held, *fds):
            os.close(fd)
    assert done.stdout == "BACK\n", done.stderr
    calls = log.read_text().splitlines()
    waits = [c for c in calls if c.startswith("-s -w")]
    checks = [c for c in calls if c.startswith("-n -s")]
    assert (len(waits), len(checks)) == {"held": (4, 2), "standing_still": (2, 1), "moving": (4, 0),
                                         "drained": (4, 0)}[line], calls


@pytest.mark.timeout(10)
def test_the_shell_gets_its_descriptors_where_nothing_else_of_ours_is_open() -> None:
    # It took the lowest close-on-exec descriptor below 10, ours or not:
    # in a run that came back, that could be the runner thread's pipe from
    # its caller. The ticket put there under it read as its caller gone;
    # the thread withdrew the ticket, and the run came back to a place no
    # longer in line ("cannot take back the run's place", issue 51).
    import sys

    probe = ("import os, sys\n"
             "sys.path[:0] = sys.argv[1:2]\n"
             "from slotq.transports.away import digits_for\n"
             "busy = list(os.pipe()) + list(os.pipe())  # the runner thread's (close-on-exec, open)\n"
             "ticket = os.open('/dev/null', os.O_RDONLY)\n"
             "while ticket < 11: ticket = os.open('/dev/null', os.O_RDONLY)  # every one below 10 open\n"
             "own, other = digits_for(ticket, ticket + 1, busy)\n"
             "assert own not in busy and other not in busy and 3 <= own <= 9 and 3 <= other <= 9, (own, other)\n"
             "assert digits_for(5, ticket, busy)[0] == 5  # the ticket below 10 stays where it is\n"
             "try: digits_for(40, 41, list(range(3, 10)))\n"
             "except OSError as e: print('refused:', e)\n")
    import slotq

    src = str(Path(slotq.__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", probe, src], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "refused: [Errno 0] no two descriptors below 10 to give the shell\n", done.stdout


# ---------------------------------------------------------------- kept runs (issue 66, item 7)

def kept_far(state_dir: Path, tmp_path: Path, *extra: str, command: str = "true") -> tuple[str, int]:
    """A kept run (`run --detach`) behind the slow line: its run id and its
    process's pid, once that process waits away."""
    left = subprocess.run(slotq_cmd() + ["run", "--detach", "--credit-dir", str(tmp_path), *extra, "--",
                                         "sh", "-c", command], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert left.returncode == 0, left.stderr
    run_id = left.stdout.strip()
    from slotq.host.line import list_tickets, pool_dir, read_info

    def its_pid() -> int | None:
        for _, path in list_tickets(pool_dir(str(state_dir), "shared")):
            info = read_info(path) or {}
            pid = info.get("pid")
            if info.get("run_id") == run_id and isinstance(pid, int):
                return pid
        return None

    pid = wait_for(its_pid, what="the kept run in line")
    wait_for(lambda: away_pid(pid), what="the kept run waiting away")
    return run_id, pid


def test_a_kept_run_far_back_waits_as_a_shell_its_attacher_says_its_place_and_it_runs_in_its_turn(
        state_dir: Path, runs: Start, tmp_path: Path, slow_line: Path) -> None:
    # Before: a kept run far back was two interpreters (its process and its
    # standby keeper), about twice a plain quiet waiter's memory away.
    run_id, pid = kept_far(state_dir, tmp_path, "--report-every", "1", command=f"echo kept >> {slow_line}")
    helpers = wait_for(lambda: h if len(h := children_of(pid)) == 2 else None, what="its flock and its watcher")
    total = pss_kb(pid) + sum(pss_kb(p) for p in helpers)
    assert total < 1024, f"a kept run waiting away is {total} kB (sh, flock and its watcher)"
    # Its attacher reports its place itself: the run's process says nothing away.
    seen = subprocess.run(slotq_cmd() + ["attach", run_id, "--for", "3.5s"], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert seen.returncode == 75, seen.stderr
    places = [line for line in seen.stderr.splitlines() if line.startswith("slotq: waiting")]
    assert len(places) >= 3 and all(f"position {AWAY_AHEAD + 2} " in p for p in places), seen.stderr
    assert away_pid(pid), "an attacher does not bring it back"
    release_and_see_the_others_run(tmp_path, slow_line)
    back = subprocess.run(slotq_cmd() + ["attach", run_id, "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert back.returncode == 0, back.stderr
    assert slow_line.read_text().split()[-1] == "kept"
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["outcome"] == "passed" and result["ticket"] is not None, result
    key = f"{run_id}:queue"
    ledger = os.environ["SLOTQ_LEDGER"]
    assert len(spool_ops(ledger, key, "open")) == 1 and len(spool_ops(ledger, key, "close")) == 1
    assert spool_ops(ledger, key, "close")[0]["end"] == pytest.approx(result["phases"]["slot"], abs=0.5)
    assert [r["outcome"] for r in history_of(state_dir, run_id)] == ["passed"]


def test_a_kept_run_waiting_away_is_cancelled_by_slotq_cancel(state_dir: Path, runs: Start, tmp_path: Path,
                                                               slow_line: Path) -> None:
    run_id, pid = kept_far(state_dir, tmp_path)
    done = subprocess.run(slotq_cmd() + ["cancel", run_id], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: history_of(state_dir, run_id), what="its history line")
    (line,) = history_of(state_dir, run_id)
    assert line["outcome"] == "cancelled" and "slotq cancel" in line["message"], line
    assert len(live_tickets(state_dir)) == AWAY_AHEAD + 1, "its place left the line; the others kept theirs"


def test_a_kept_run_whose_lease_lapses_while_away_ends_caller_gone_in_time(
        state_dir: Path, runs: Start, tmp_path: Path, slow_line: Path) -> None:
    began = time.monotonic()
    run_id, pid = kept_far(state_dir, tmp_path, "--lease", "3s")
    wait_for(lambda: history_of(state_dir, run_id), timeout=15, what="its history line")
    assert time.monotonic() - began < 3 + 8, "back at its lease's end, not at its next look (5m)"
    (line,) = history_of(state_dir, run_id)
    assert line["outcome"] == "caller_gone" and "nobody attached within the 3.0s lease" in line["message"], line


def test_a_kept_run_killed_while_away_is_caller_gone_and_its_attacher_says_so(
        state_dir: Path, runs: Start, tmp_path: Path, slow_line: Path) -> None:
    run_id, pid = kept_far(state_dir, tmp_path)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: history_of(state_dir, run_id), what="its watcher's line")
    back = subprocess.run(slotq_cmd() + ["attach", run_id, "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert back.returncode == 129, back.stderr
    assert json.loads((tmp_path / "r.json").read_text())["outcome"] == "caller_gone"
    assert len(live_tickets(state_dir)) == AWAY_AHEAD + 1


def test_a_stop_signal_to_a_kept_run_waiting_away_cancels_it(state_dir: Path, runs: Start, tmp_path: Path,
                                                             slow_line: Path) -> None:
    run_id, pid = kept_far(state_dir, tmp_path)
    os.kill(pid, signal.SIGTERM)  # as to its process, never away: a cancel
    wait_for(lambda: history_of(state_dir, run_id), what="its history line")
    (line,) = history_of(state_dir, run_id)
    assert line["outcome"] == "cancelled" and "SIGTERM" in line["message"], line


def test_the_run_going_away_waits_on_a_ticket_ahead_even_when_the_lock_table_misses_its_own(
        state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc/locks is read a page at a time, no snapshot: a lock let go
    # between two reads moves the rest, and our own can be missed. The line
    # then had every ticket behind ours ahead of it, and a run going away
    # waited on one behind it: at its turn the line stood still (a line of
    # 200 took minutes, every fifth run passed over).
    from slotq.host import away, proclocks
    from slotq.host.line import pool_dir
    from slotq.host.hostqueue import ensure_state_dir
    from slotq.host.ticket import take_ticket

    ensure_state_dir(str(state_dir))
    tickets = [take_ticket(str(state_dir), "shared", {"run_id": f"t{i}"}) for i in range(12)]
    try:
        mine = tickets[7]
        real = proclocks.owners

        def missing_mine(data: bytes | None = None) -> dict[tuple[int, int], list[int]] | None:
            table = real(data)
            assert table is not None
            st = os.stat(mine.path)
            table.pop((st.st_dev, st.st_ino))
            return table

        monkeypatch.setattr(proclocks, "owners", missing_mine)
        ahead = away._live_ahead(mine.path)
        assert ahead == [t.path for t in tickets[:7]]
        from slotq.host.line import place

        assert place(pool_dir(str(state_dir), "shared"), mine.path)[:2] == (7, 12)
    finally:
        for t in tickets:
            t.withdraw()
