"""`slotq host run` as a transport launches it: stdin is the caller's
channel, stdout the framed stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import group_alive, slotq_cmd, wait_for
from slotq import protocol
from slotq.clock import Clock
from slotq.config import HostConfig
from slotq.history import recent
from slotq.host.line import list_tickets, pool_dir, probe
from slotq.host.runner import HostRunner
from slotq.host.slot import read_slot
from slotq.spec import RunSpec


def decode(raw: bytes) -> list[tuple[bytes, object]]:
    return list(protocol.Decoder().feed(raw))


@pytest.mark.timeout(20)
def test_host_run_speaks_the_framed_stream(state_dir: Path, tmp_path: Path) -> None:
    # stdin stays open for the whole run: closing it would mean "caller gone".
    proc = subprocess.Popen(slotq_cmd() + ["host", "run", "--budget", "30", "--label", "t", "--",
                                           "sh", "-c", "printf out; printf err >&2; exit 3"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdout is not None and proc.stdin is not None
    raw = proc.stdout.read()
    proc.stdin.close()
    assert proc.wait(timeout=5) == 0
    frames = decode(raw)
    events = [p for k, p in frames if k == protocol.EVENT]
    names = [e["event"] for e in events]  # type: ignore[index]
    print(names, events)
    assert names == ["hello", "slot", "started", "exited"]
    # A client that names no protocol (the previous release's) gets the one it reads.
    assert raw.startswith(protocol.magic(protocol.BASE)) and events[0]["protocol"] == protocol.BASE  # type: ignore[index]
    exited = events[-1]
    assert exited["outcome"] == "failed" and exited["exit_code"] == 3  # type: ignore[index]
    assert (protocol.STDOUT, b"out") in frames and (protocol.STDERR, b"err") in frames


@pytest.mark.timeout(20)
def test_host_run_speaks_the_protocol_the_request_names_and_refuses_one_it_does_not_speak(
        state_dir: Path, tmp_path: Path) -> None:
    import json

    def request(wanted: int) -> subprocess.CompletedProcess[bytes]:
        """The run, its stdin (the caller's channel) open until it ends."""
        line = json.dumps({"argv": ["true"], "cwd": str(tmp_path), "protocol": wanted}).encode() + b"\n"
        p = subprocess.Popen(slotq_cmd() + ["host", "run", "--request-stdin"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
        assert p.stdin is not None and p.stdout is not None and p.stderr is not None
        p.stdin.write(line)
        p.stdin.flush()
        out = p.stdout.read()
        p.stdin.close()
        return subprocess.CompletedProcess(p.args, p.wait(timeout=15), out, p.stderr.read())

    newest = request(protocol.PROTOCOL_VERSION)
    assert newest.stdout.startswith(protocol.magic(protocol.PROTOCOL_VERSION)), newest.stderr
    events = [p for k, p in decode(newest.stdout) if k == protocol.EVENT]
    assert events[0]["protocol"] == protocol.PROTOCOL_VERSION and events[-1]["outcome"] == "passed"  # type: ignore[index]
    future = request(protocol.PROTOCOL_VERSION + 1)
    err = future.stderr.decode()
    assert future.returncode == 64 and err.count("\n") == 1 and not future.stdout, err
    assert f"asks for stream protocol {protocol.PROTOCOL_VERSION + 1}" in err and "this host's slotq 0.2.0" in err
    assert "pip install -U slotq" in err
    assert not list_tickets(pool_dir(str(state_dir), "shared")), "refused before it queued"


@pytest.mark.timeout(20)
def test_host_run_withdraws_its_ticket_when_stdin_closes(state_dir: Path, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = subprocess.Popen(slotq_cmd() + ["host", "run", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.01; done"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    def tickets() -> list[str]:
        return [p for _, p in list_tickets(pool_dir(str(state_dir), "shared")) if probe(p)]

    # The holder's record says `running` before it has left the line.
    wait_for(lambda: (read_slot(str(state_dir), "shared", 0)[1] or {}).get("phase") == "running" and not tickets(),
             what="holder running, out of the line")
    queued = subprocess.Popen(slotq_cmd() + ["host", "run", "--report-every", "0.1", "--", "true"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    wait_for(lambda: len(tickets()) == 1, what="queued ticket")
    assert queued.stdin is not None and queued.stdout is not None
    queued.stdin.close()
    assert queued.wait(timeout=5) == 0
    events = [p for k, p in decode(queued.stdout.read()) if k == protocol.EVENT]
    assert events[-1]["outcome"] == "caller_gone"  # type: ignore[index]
    assert "queued" in [e["event"] for e in events]  # type: ignore[index]
    assert tickets() == []
    gate.touch()
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(timeout=5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("then_closed", [False, True], ids=["channel-open", "channel-closed"])
def test_a_pass_that_came_with_the_request_releases_the_slot_at_once(state_dir: Path, tmp_path: Path,
                                                                     then_closed: bool) -> None:
    # A late-bound caller that took a slot elsewhere says `pass` to the other
    # hosts at once -- often before a host's runner has started and read its
    # request, so both come in one read. The runner must hear it then: no
    # more bytes come (the caller's channel stays open while its command
    # runs elsewhere), and the slot it offers would stay held until the end.
    spec = RunSpec(["sh", "-c", f"touch {tmp_path / 'ran'}"], cls="shared", budget=30, cwd=str(tmp_path))
    spec.bind = ["slotq-elsewhere"]
    proc = subprocess.Popen(slotq_cmd() + ["host", "run", "--request-stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(spec.to_request() + b"pass\n")
    proc.stdin.flush()
    if then_closed:
        proc.stdin.close()  # its command ended elsewhere already: the pass still counts, not a caller gone
    try:
        assert proc.wait(timeout=10) == 0  # stdin still open: it ended on the word it had
        events = [p for k, p in decode(proc.stdout.read()) if k == protocol.EVENT]
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait()
    assert [e["event"] for e in events] == ["hello", "offered"]  # type: ignore[index]
    assert not (tmp_path / "ran").exists()
    assert read_slot(str(state_dir), "shared", 0)[1] is None  # nobody holds it
    assert [p for _, p in list_tickets(pool_dir(str(state_dir), "shared")) if probe(p)] == []
    assert [r for r in recent(str(state_dir), 10) if r.get("run_id") == spec.run_id] == []  # a reservation's pass leaves none


@pytest.mark.timeout(30)
def test_the_history_names_the_stop_signal_of_a_cancel_the_callers_or_one_to_the_runner(
        state_dir: Path, tmp_path: Path) -> None:
    # The host's history said "cancelled by the caller (Ctrl-C or a stop
    # signal)" or "left the queue before getting a slot", whichever signal:
    # a harness's SIGTERM (its timeout) and a person's Ctrl-C look alike.
    pidf = tmp_path / "pid"
    holder = subprocess.Popen(slotq_cmd() + ["host", "run", "--kill-grace", "1", "--", "sh", "-c",
                                             f"echo $$ > {pidf}; sleep 100"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def tickets() -> list[str]:
        return [p for _, p in list_tickets(pool_dir(str(state_dir), "shared")) if probe(p)]

    wait_for(lambda: pidf.exists() and pidf.read_text().strip() and not tickets(), what="holder running")
    ends = []
    for word in ("SIGTERM", "SIGINT", "cancelled"):  # the last as a caller before this change says it
        queued = subprocess.Popen(slotq_cmd() + ["host", "run", "--", "true"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        assert queued.stdin is not None and queued.stdout is not None
        wait_for(lambda: len(tickets()) == 1, what="queued ticket")
        queued.stdin.write(f"cancel {word}\n".encode())
        queued.stdin.flush()
        events = [p for k, p in decode(queued.stdout.read()) if k == protocol.EVENT]
        queued.stdin.close()
        assert queued.wait(timeout=10) == 0
        ends.append((events[-1]["outcome"], events[-1]["message"]))  # type: ignore[index]
    assert ends == [("cancelled", "cancelled (SIGTERM) while it waited for a slot; nothing ran"),
                    ("cancelled", "cancelled (Ctrl-C) while it waited for a slot; nothing ran"),
                    ("cancelled", "left the queue before getting a slot")]
    holder.send_signal(signal.SIGTERM)  # someone on the host: the runner's own signal
    assert holder.stdout is not None and holder.stdin is not None
    events = [p for k, p in decode(holder.stdout.read()) if k == protocol.EVENT]
    holder.stdin.close()
    assert holder.wait(timeout=10) == 0
    assert (events[-1]["outcome"], events[-1]["message"]) == (  # type: ignore[index]
        "cancelled", "cancelled (SIGTERM to the host runner) while the command ran: stopped")
    hist = json.loads(subprocess.run(slotq_cmd() + ["history", "--json"], capture_output=True, text=True,
                                     timeout=20).stdout)
    assert [h["message"] for h in hist][-1] == events[-1]["message"]  # type: ignore[index]
    assert not tickets() and not group_alive(int(pidf.read_text()))


def test_help_explains_commands_and_exit_codes() -> None:
    top = subprocess.run(slotq_cmd() + ["--help"], capture_output=True, text=True, timeout=10)
    assert top.returncode == 0 and "run" in top.stdout and "status" in top.stdout
    run = subprocess.run(slotq_cmd() + ["run", "--help"], capture_output=True, text=True, timeout=10)
    assert run.returncode == 0
    for needle in ("--budget", "--idle", "exec_timeout", "124", "backstop", "SLOTQ_STATE_DIR"):
        assert needle in run.stdout
    bad = subprocess.run(slotq_cmd() + ["frobnicate"], capture_output=True, text=True, timeout=10)
    assert bad.returncode == 64 and "unknown command 'frobnicate'" in bad.stderr
    # A typo names what was meant.
    for typo, meant in ((["stauts"], "unknown command 'stauts' (did you mean status?)"),
                        (["hist"], "unknown command 'hist' (did you mean history?)"),
                        (["run", "--budgte", "5m", "--", "true"], "unknown option --budgte (did you mean --budget?)"),
                        (["history", "--sinse", "1h"], "unknown option --sinse (did you mean --since?)")):
        bad = subprocess.run(slotq_cmd() + typo, capture_output=True, text=True, timeout=10)
        assert bad.returncode == 64 and meant in bad.stderr and len(bad.stderr.splitlines()) == 1, bad.stderr


@pytest.mark.parametrize("args,needle", [
    (["host", "--help"], "reap RUN_ID"), (["host", "-h"], "hello"),
    (["host", "hello", "--help"], "usage: slotq host hello\n"),
    (["host", "reap", "-h"], "usage: slotq host reap RUN_ID\n"),
    (["host", "init", "--help"], "--group"), (["host", "run", "--help"], "--request-stdin"),
])
def test_every_host_command_explains_itself_with_help(state_dir: Path, args: list[str], needle: str) -> None:
    # `slotq host --help` was an error (exit 2); `host hello --help` did its work instead.
    proc = subprocess.run(slotq_cmd() + args, capture_output=True, text=True, timeout=10)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert proc.stdout.startswith("usage: slotq host") and needle in proc.stdout
    assert not state_dir.exists()  # help only: nothing made


@pytest.mark.parametrize("args,needle", [
    (["host"], "name a host command: init, check, drain, resume, hello, reap, run, keep or attach "
               "(see `slotq host --help`)"),
    (["host", "frob"], "unknown host command 'frob'"),
    (["host", "hello", "--json"], "slotq host hello (it takes no options)"),
    (["host", "reap"], "usage: slotq host reap RUN_ID"),
    # a request's run_id is checked so; this one was taken as it was, and ran
    (["host", "run", "--run-id", "a/b", "--", "true"], "option --run-id: 'a/b' is not a run id"),
])
def test_a_bad_host_command_is_one_line_and_exit_64(state_dir: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(slotq_cmd() + args, capture_output=True, text=True, timeout=10)
    assert (proc.returncode, proc.stdout) == (64, "")
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


class _SlowClock(Clock):
    """The real clock, each reading 0.1 s later than the one before: a
    machine so busy that a run's first report comes long after its ticket."""

    def __init__(self) -> None:
        self.skew = 0.0

    def monotonic(self) -> float:
        self.skew += 0.1
        return time.monotonic() + self.skew


@pytest.mark.timeout(30)
def test_the_first_report_of_a_wait_has_no_eta_however_late_it_comes(state_dir: Path, tmp_path: Path) -> None:
    # The ETA reads the run history: the first report, made the moment a run
    # must wait (often for a slot that frees in milliseconds), skips it --
    # also on a busy machine, where that moment comes late.
    gate = tmp_path / "gate"
    holder = subprocess.Popen(slotq_cmd() + ["host", "run", "--", "sh", "-c",
                                             f"while [ ! -e {gate} ]; do sleep 0.01; done"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    wait_for(lambda: read_slot(str(state_dir), "shared", 0)[0], what="the holder in the slot")
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    runner = HostRunner(RunSpec(["true"], budget=30, cwd=str(tmp_path)), state_dir=str(state_dir),
                        config=HostConfig(), in_fd=in_r, out_fd=out_w, clock=_SlowClock())
    done = threading.Thread(target=runner.run, daemon=True)
    done.start()
    try:
        decoder = protocol.Decoder()
        queued: list[dict[str, object]] = []
        while not queued:
            data = os.read(out_r, 65536)
            assert data, "the stream ended before a report"
            queued = [p for k, p in decoder.feed(data)
                      if k == protocol.EVENT and isinstance(p, dict) and p.get("event") == "queued"]
        first = queued[0]
        assert float(first["waited_s"]) > 0.05  # type: ignore[arg-type]  # late, as on a busy machine
        assert "eta_s" not in first and "eta_how" not in first, first
    finally:
        os.close(in_w)  # the caller is gone: the run leaves the line
        done.join(10)
        gate.touch()
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
        runner.close_stream()  # out_w, once (the runner may have closed it)
        os.close(in_r)
        os.close(out_r)


def _queued_within(out_r: int, decoder: protocol.Decoder, seconds: float,
                   enough: int | None = None) -> list[dict[str, object]]:
    """The `queued` events the stream brings within `seconds` -- or as soon
    as there are `enough` of them."""
    import select

    got: list[dict[str, object]] = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0 and (enough is None or len(got) < enough):
        ready, _, _ = select.select([out_r], [], [], left)
        if not ready:
            break
        data = os.read(out_r, 65536)
        assert data, "the stream ended"
        got += [p for k, p in decoder.feed(data)
                if k == protocol.EVENT and isinstance(p, dict) and p.get("event") == "queued"]
    return got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("slots", [1, 2])  # 1: its standby keeper waits; 2: the run itself (inotify)
def test_a_quiet_run_behind_others_reports_once_then_only_at_the_head(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slots: int) -> None:
    # -q: nobody reads the reports. Behind another waiter a quiet run says
    # once that it waits (its caller opens the wait record), without looking
    # at the line, then sleeps until it is the head -- whose reports end
    # orphaned holders, so they go on there.
    cfg = tmp_path / "host.toml"
    cfg.write_text(f"[pools]\nshared = {slots}\nlanding = 1\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(cfg))
    gate = tmp_path / "gate"
    holders = [subprocess.Popen(slotq_cmd() + ["host", "run", "--", "sh", "-c",
                                               f"while [ ! -e {gate} ]; do sleep 0.01; done"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL) for _ in range(slots)]
    pdir = pool_dir(str(state_dir), "shared")

    def tickets() -> int:
        return len([p for _, p in list_tickets(pdir) if probe(p)])

    wait_for(lambda: all(read_slot(str(state_dir), "shared", i)[0] for i in range(slots)) and tickets() == 0,
             what="every slot held")
    ahead = subprocess.Popen(slotq_cmd() + ["host", "run", "--", "true"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL)
    wait_for(lambda: tickets() == 1, what="a waiter ahead")
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    runner = HostRunner(RunSpec(["true"], budget=30, cwd=str(tmp_path), report_every=0.05, quiet=True),
                        state_dir=str(state_dir), config=HostConfig.load(), in_fd=in_r, out_fd=out_w)
    done = threading.Thread(target=runner.run, daemon=True)
    done.start()
    try:
        decoder = protocol.Decoder()
        first = _queued_within(out_r, decoder, 10.0, enough=1)[:1]
        assert first and "ahead" not in first[0] and "holders" not in first[0], first
        # Twenty report periods behind the waiter ahead: not one report.
        assert _queued_within(out_r, decoder, 1.0) == []
        assert ahead.stdin is not None
        ahead.stdin.close()  # the waiter ahead leaves: ours is the head
        assert ahead.wait(timeout=10) == 0
        at_head = _queued_within(out_r, decoder, 10.0, enough=2)
        assert at_head and at_head[0]["ahead"] == 0, at_head
    finally:
        os.close(in_w)  # the caller is gone: the run leaves the line
        done.join(10)
        gate.touch()
        for h in holders:
            assert h.stdin is not None
            h.stdin.close()
            h.wait(timeout=10)
        if ahead.poll() is None:
            ahead.kill()
            ahead.wait()
        runner.close_stream()
        os.close(in_r)
        os.close(out_r)
