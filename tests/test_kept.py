"""Kept runs on this machine (issue 46, DESIGN.md 1a): a run that outlives
the call that made it -- `run --attach-for`, `run --detach`, `attach`, the
lease -- driven end to end through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Start, history_written, live_tickets, second_user_slotq, slotq_cmd, spool_ops, start_holder, wait_for


def slotq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def result_of(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def kept_dir(tmp_path: Path, run_id: str) -> Path:
    return tmp_path / "kept" / run_id  # beside $SLOTQ_LEDGER (the state_dir fixture's)


def detach_waiting(tmp_path: Path, *extra: str, cmd: tuple[str, ...] = ("echo", "hello")) -> str:
    """`run --detach` of a run that must wait: its run id, once it is in line."""
    proc = slotq("run", "--detach", *extra, "--", *cmd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.timeout(60)
def test_attach_for_leaves_a_waiting_run_in_its_place_and_attach_gets_its_result(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    began = time.monotonic()
    left = slotq("run", "--attach-for", "2s", "--json", str(tmp_path / "left.json"), "--", "echo", "hello")
    took = time.monotonic() - began
    assert left.returncode == 75, left.stderr
    assert 2.0 <= took < 8.0
    rec = result_of(tmp_path / "left.json")
    run_id = rec["run_id"]
    assert rec["outcome"] == "detached" and rec["exit_code"] == 75
    last = left.stderr.strip().splitlines()[-1]
    assert f"slotq attach {run_id}" in last and "waiting at position 1" in last
    assert left.stdout == ""  # the command has not run
    assert len(live_tickets(state_dir)) == 1  # its place, still in line
    status = json.loads(slotq("status", "--json").stdout)
    waiting = [t for p in status["pools"] for t in p["waiting"]]
    assert [t["run_id"] for t in waiting] == [run_id] and waiting[0]["kept"] == {"lease_s": 900.0}
    opened = time.time()
    wait_for(lambda: time.time() - rec["phases"]["submitted"] >= 6, timeout=20, what="6 s in line",
             interval=0.05)
    gate.touch()
    back = slotq("attach", run_id, "--for", "30s", "--json", str(tmp_path / "back.json"))
    assert back.returncode == 0, back.stderr
    assert back.stdout == "hello\n"
    res = result_of(tmp_path / "back.json")
    assert res["outcome"] == "passed" and res["run_id"] == run_id and res["label"] == rec["label"]
    assert res["waited_s"] >= 6 and res["phases"]["slot"] >= opened - 1
    assert "slotq: passed (exit 0)" in back.stderr.strip().splitlines()[-1]
    # The wait is in the ledger once, opened and closed by the run's own process.
    key = f"{run_id}:queue"
    ledger = str(tmp_path / "ledger.sqlite")
    assert len(spool_ops(ledger, key, "open")) == 1
    closes = spool_ops(ledger, key, "close")
    assert len(closes) == 1 and abs(closes[0]["end"] - res["phases"]["slot"]) < 0.5
    assert not kept_dir(tmp_path, run_id).exists()  # its result taken: its log is gone
    again = slotq("attach", run_id, "--json", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stderr
    assert result_of(tmp_path / "again.json")["outcome"] == "passed"  # from the history


@pytest.mark.timeout(60)
def test_run_detach_prints_the_run_id_once_its_place_is_real(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    run_id = detach_waiting(tmp_path)
    assert run_id.isalnum() and len(live_tickets(state_dir)) == 1  # in line when it returned
    gate.touch()
    back = slotq("attach", run_id)
    assert back.returncode == 0 and back.stdout == "hello\n", back.stderr


@pytest.mark.timeout(60)
def test_killing_an_attach_does_not_end_or_withdraw_the_run(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run_id, attach = _attached_behind_a_holder(state_dir, runs, gate, tmp_path, start_new_session=True)
    os.killpg(attach.pid, signal.SIGKILL)  # as a harness ends a tool call
    attach.communicate(timeout=10)
    wait_for(lambda: not _attached(tmp_path, run_id), what="the attacher to be gone")
    assert len(live_tickets(state_dir)) == 1
    gate.touch()
    back = slotq("attach", run_id)
    assert back.returncode == 0 and back.stdout == "hello\n", back.stderr


@pytest.mark.timeout(60)
def test_a_stop_signal_to_attach_leaves_the_run_which_goes_on(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run_id, attach = _attached_behind_a_holder(state_dir, runs, gate, tmp_path)
    attach.send_signal(signal.SIGTERM)
    _, err = attach.communicate(timeout=20)
    assert attach.returncode == 75, err
    assert f"slotq attach {run_id}" in err.strip().splitlines()[-1]
    assert len(live_tickets(state_dir)) == 1
    gate.touch()
    assert slotq("attach", run_id).returncode == 0


@pytest.mark.timeout(60)
def test_a_lease_that_lapses_in_line_withdraws_the_run_as_caller_gone(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    run_id = detach_waiting(tmp_path, "--lease", "1s")
    wait_for(lambda: not live_tickets(state_dir), timeout=15, what="the lapsed run to leave the line")
    back = slotq("attach", run_id, "--json", str(tmp_path / "r.json"))
    res = result_of(tmp_path / "r.json")
    assert back.returncode == 129 and res["outcome"] == "caller_gone", back.stderr
    assert "nobody attached within the 1.0s lease while it waited for a slot" in res["message"]
    gate.touch()


@pytest.mark.timeout(60)
def test_a_lease_that_lapses_while_running_ends_the_command_within_the_grace(
        state_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    proc = slotq("run", "--detach", "--lease", "1s", "--kill-grace", "1s", "--",
                 "sh", "-c", f"touch {marker}; exec sleep 60")
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    wait_for(marker.exists, what="the command to start")
    # Nobody attaches (an attach would renew the lease): the history says when it ended.
    wait_for(lambda: [r for r in history_written(state_dir) if r.get("run_id") == run_id], timeout=20,
             what="the run to end", interval=0.05)
    back = slotq("attach", run_id, "--json", str(tmp_path / "r.json"))
    res = result_of(tmp_path / "r.json")
    assert back.returncode == 129 and res["outcome"] == "caller_gone", back.stderr
    assert "nobody attached within the 1.0s lease while the command ran: stopped" in res["message"]
    ph = res["phases"]
    assert ph["ended"] - ph["started"] < 1 + 1 + 1 + 3  # the lease, its check, the grace, a busy machine


@pytest.mark.timeout(60)
def test_output_past_the_bound_keeps_its_head_and_tail_byte_exact(state_dir: Path, tmp_path: Path) -> None:
    data = os.urandom(8 << 20)  # no two places alike: where the middle went shows
    src = tmp_path / "data"
    src.write_bytes(data)
    proc = slotq("run", "--detach", "--log-max", "1M", "--", "cat", str(src))
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    # Read back once it has ended (an attacher that follows it live gets every byte as it comes).
    wait_for(lambda: [r for r in history_written(state_dir) if r.get("run_id") == run_id], timeout=30,
             what="the run to end", interval=0.05)
    back = subprocess.run(slotq_cmd() + ["attach", run_id, "--from-start"], capture_output=True, timeout=60)
    assert back.returncode == 0, back.stderr
    out = back.stdout
    assert len(out) < 1 << 20
    head = len(os.path.commonprefix([out, data]))  # where the middle was dropped
    assert head >= 256 << 10  # (the log's first half holds the framing too)
    tail = len(out) - head
    assert tail >= 128 << 10 and out[head:] == data[-tail:]
    assert b"bytes of the run's stream were dropped here" in back.stderr


@pytest.mark.timeout(60)
def test_another_user_cannot_attach_to_or_cancel_a_kept_run(
        shared_state: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, shared_state, gate)
    run_id = detach_waiting(tmp_path)
    for argv in (["attach", run_id, "--for", "1s"], ["cancel", run_id]):
        proc = subprocess.run(["runuser", "-u", "slotqtest", "--", *second_user_slotq(), *argv],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert proc.returncode not in (0, 75), (argv, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert len(live_tickets(shared_state)) == 1
    gate.touch()
    assert slotq("attach", run_id).returncode == 0


@pytest.mark.timeout(30)
def test_attach_of_an_unknown_run_is_one_line_and_exit_66_as_cancel_says_it(state_dir: Path) -> None:
    proc = slotq("attach", "nosuchrun1")
    assert proc.returncode == 66  # EX_NOINPUT: `slotq cancel`'s "no such run" too (it was 64 here, 66 there)
    assert slotq("cancel", "nosuchrun1").returncode == 66
    assert proc.stderr.strip() == ("slotq attach: error: host: no kept run nosuchrun1 of yours on this host "
                                   "(nor in its history)") or "no kept run nosuchrun1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _attached_behind_a_holder(state_dir: Path, runs: Start, gate: Path, tmp_path: Path,
                              start_new_session: bool = False) -> tuple[str, subprocess.Popen[str]]:
    """A kept run waiting behind a holder (until `gate`), and a `slotq
    attach` of it, attached."""
    start_holder(runs, state_dir, gate)
    run_id = detach_waiting(tmp_path)
    attach = subprocess.Popen(slotq_cmd() + ["attach", run_id], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=start_new_session)
    wait_for(lambda: _attached(tmp_path, run_id), what="the attacher to be attached")
    return run_id, attach


def _attached(tmp_path: Path, run_id: str) -> bool:
    from slotq.host import kept

    return kept.held(str(kept_dir(tmp_path, run_id) / "attached"))


@pytest.mark.timeout(60)
def test_the_python_api_submits_attaches_and_cancels(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    import asyncio

    from slotq.client.kept import KeptRun, submit
    from slotq.spec import RunSpec

    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    run = submit(RunSpec(["echo", "hello"], label="api"))
    assert len(live_tickets(state_dir)) == 1
    left = run.attach(timeout=0.5, stdout_fd=-1, stderr_fd=-1)
    assert left.outcome == "detached" and left.exit_code == 75 and left.run_id == run.run_id
    left = asyncio.run(KeptRun(run.run_id).attach_async(0.2, stdout_fd=-1, stderr_fd=-1))
    assert left.outcome == "detached" and left.label == "api"
    assert run.cancel()
    res = run.result(stdout_fd=-1, stderr_fd=-1)
    assert res.outcome == "cancelled" and "cancelled by slotq cancel" in res.message
    assert not live_tickets(state_dir)
    assert run.cancel() is False, "one that has ended is not cancelled (slotq cancel exits 0 for it: nothing to do)"
    gate.touch()


@pytest.mark.timeout(60)
def test_a_kept_runs_idle_watchdog_is_kept_by_its_host_side(state_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    proc = slotq("run", "--detach", "--idle", "1s", "--kill-grace", "1s", "--",
                 "sh", "-c", f"echo one; touch {marker}; exec sleep 60")
    assert proc.returncode == 0, proc.stderr
    back = slotq("attach", proc.stdout.strip(), "--json", str(tmp_path / "r.json"))
    assert back.returncode == 123, back.stderr
    assert back.stdout == "one\n"
    res = result_of(tmp_path / "r.json")
    assert res["outcome"] == "idle_timeout" and res["ran_s"] < 1 + 1 + 3


@pytest.mark.timeout(120)
def test_a_kept_run_over_ssh_keeps_its_place_and_attach_comes_back_over_ssh(
        remote: Any, runs: Start, tmp_path: Path) -> None:
    from slotq.client.ledger import Ledger

    base = f"$HOME/st-{remote.tag}"  # the remote fixture removes it, the run's log with it
    args = ["--host", remote.host, "--ssh-config", remote.cfg, "--remote-slotq",
            f"SLOTQ_STATE_DIR={base}/q SLOTQ_LEDGER={base}/l/ledger.sqlite slotq"]

    def shared() -> dict[str, Any]:
        proc = slotq("status", "--json", *args)
        assert proc.returncode == 0, proc.stderr
        return dict(next(p for p in json.loads(proc.stdout)["pools"] if p["pool"] == "shared"))

    runs(*args, "--label", "placeholder", "--", *remote.gate_cmd(), name="holder")
    wait_for(lambda: shared()["slots"][0].get("phase") == "running", timeout=30, what="the remote holder")
    left = subprocess.run(slotq_cmd() + ["run", *args, "--attach-for", "2s", "--json", str(tmp_path / "left.json"),
                                         "--", "echo", "hello"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert left.returncode == 75, left.stderr
    run_id = result_of(tmp_path / "left.json")["run_id"]
    waiting = shared()["waiting"]
    assert [w["run_id"] for w in waiting] == [run_id] and waiting[0]["kept"] == {"lease_s": 900.0}
    remote.ssh(f"touch {remote.gate()}")
    back = subprocess.run(slotq_cmd() + ["attach", run_id, *args, "--for", "30s", "--json", str(tmp_path / "b.json")],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert back.returncode == 0, back.stderr
    assert back.stdout == "hello\n"
    res = result_of(tmp_path / "b.json")
    assert res["outcome"] == "passed" and res["waited_s"] >= 2.0
    queued = [w for w in Ledger().credit(str(tmp_path), 0, time.time()).waits
              if w.record.run_id == run_id and w.record.kind == "queue"]
    assert len(queued) == 1 and queued[0].seconds >= 2.0  # recorded here, once, by the attacher that saw the slot


@pytest.mark.timeout(60)
def test_run_detach_prints_only_the_run_id_even_when_the_command_has_printed(
        state_dir: Path, tmp_path: Path) -> None:
    # A free slot: the command starts, and may print, before --detach has
    # read its place from the log; its stdout is the run id alone.
    marker = tmp_path / "printed"
    proc = slotq("run", "--detach", "--", "sh", "-c", f"echo one; touch {marker}; exec sleep 1")
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    assert run_id.isalnum(), proc.stdout
    back = slotq("attach", run_id)
    assert back.returncode == 0 and back.stdout == "one\n", back.stderr  # the output is the attach's


@pytest.mark.timeout(30)
def test_a_detaching_follower_sends_nothing_past_the_place_and_keeps_it_for_the_next(tmp_path: Path) -> None:
    # The race behind the test above, made certain: the log already holds the
    # command's output when `run --detach` reads its place from it (CI saw
    # "one" before the run id on --detach's stdout).
    from slotq import protocol
    from slotq.host import kept
    from slotq.host.follow import Follower
    from slotq.records import to_json

    path = tmp_path / "run1"
    path.mkdir(mode=0o700)
    (path / "request").write_bytes(kept.to_json_line({"request": {"argv": ["x"], "run_id": "run1"}}))
    log = kept.KeptLog(str(path))
    log.write(protocol.MAGIC, True)
    for name, fields in (("hello", {"protocol": protocol.PROTOCOL_VERSION}), ("slot", {"slot": "shared#0"}),
                         ("started", {})):
        log.write(protocol.event_frame(name, time.time(), **fields), True)
    log.write(protocol.frame(protocol.STDOUT, b"one\n"), False)
    log.close()
    (path / "alive").touch()
    lock = kept.lock_file(str(path / "alive"), __import__("fcntl").LOCK_EX)  # the run goes on
    r, w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    try:
        assert Follower(str(path), w, ctl_r).follow(None, until_placed=True) is False
        os.close(w)
        stream = b""
        while chunk := os.read(r, 65536):
            stream += chunk
        frames = protocol.Decoder().feed(stream)
        assert [k for k, _ in frames].count(protocol.STDOUT) == 0
        assert [p["event"] for k, p in frames if isinstance(p, dict)] == ["hello", "slot", "detached"]
        r2, w2 = os.pipe()
        Follower(str(path), w2, ctl_r).follow(time.monotonic(), False)  # the next attach: the output is its
        os.close(w2)
        again = b""
        while chunk := os.read(r2, 65536):
            again += chunk
        assert (protocol.STDOUT, b"one\n") in protocol.Decoder().feed(again)
    finally:
        if lock is not None:
            os.close(lock)
        for fd in (r, ctl_r, ctl_w):
            os.close(fd)


@pytest.mark.timeout(60)
def test_history_and_the_report_mark_a_kept_run_with_its_lease(state_dir: Path, tmp_path: Path) -> None:
    plain = slotq("run", "-q", "--label", "plain", "--", "true")
    assert plain.returncode == 0, plain.stderr
    run_id = detach_waiting(tmp_path, "--lease", "7m", "--label", "kept")
    assert slotq("attach", run_id).returncode == 0
    records = {r["label"]: r for r in json.loads(slotq("history", "--json").stdout)}
    assert records["kept"]["kept"] == 420 and records["plain"]["kept"] is None
    table = slotq("history").stdout.splitlines()
    assert "passed (kept)" in next(line for line in table if run_id in line)
    assert "(kept)" not in next(line for line in table if "plain" in line)
    from slotq.history.report import build

    rows: Any = build([records["kept"], records["plain"]], host="h", since=0, until=time.time())["runs"]
    assert [row[9] for row in rows] == [420, None]


@pytest.mark.timeout(10)
def test_the_hosts_of_a_late_bound_kept_run_are_read_back_only_as_written() -> None:
    from slotq.transports.kept import MAX_REACH, Reach

    reach = Reach(["ci1", "ci2"], None, ["Port=22"], "slotq", "rsync")
    back = Reach.parse(json.dumps(reach.to_dict()))
    assert back.to_dict() == reach.to_dict()
    for bad, why in (({**reach.to_dict(), "hosts": ["ci1"]}, "two to 64"),
                     ({**reach.to_dict(), "hosts": ["ci1", "-oProxyCommand=x"]}, "two to 64"),
                     ({**reach.to_dict(), "ssh_options": "Port=22"}, "ssh_options"),
                     ({**reach.to_dict(), "sync": "scp"}, "sync"),
                     ({**reach.to_dict(), "extra": 1}, "not the hosts")):
        with pytest.raises(ValueError, match=why):
            Reach.parse(json.dumps(bad))
    with pytest.raises(ValueError, match="longer than"):
        Reach.parse(" " * (MAX_REACH + 1))
    with pytest.raises(ValueError):
        Reach.parse("[" * 100 + "]" * 100)  # too deep: refused, not a RecursionError
