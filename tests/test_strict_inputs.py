"""Strict inputs (issue 11): the host's stream, run requests and options,
slot files replaced under a waiter, the ticket counter, the wait ledger's
spool, a full disk and the --json file. One user; the attacks that need a
second are in test_shared_machine.py."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import one_line, slotq_cmd
from slotq import protocol
from slotq.client.caller import run
from slotq.outcome import Outcome
from slotq.host.slot import SlotProbe, slot_path
from slotq.spec import RunSpec
from slotq.host.ticket import take_ticket
from strict_fuzz import HELLO, StreamTransport, ev

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------- the host's stream

@pytest.mark.timeout(120)
def test_two_thousand_hostile_streams_and_requests_end_in_bounded_time_and_memory(tmp_path: Path) -> None:
    env = dict(os.environ, SLOTQ_LEDGER=str(tmp_path / "ledger.sqlite"), SLOTQ_STATE_DIR=str(tmp_path / "state"),
               PYTHONPATH=os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, str(HERE / "strict_fuzz.py"), "2000", "11"], capture_output=True,
                          text=True, timeout=110, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["stream_outcomes"].get("unavailable", 0) >= 1900, report
    assert report["max_rss_mb"] < 100, report
    assert report["slowest_case_s"] < 5, report
    assert report["requests_refused"] > 0 and report["requests_accepted"] > 0, report


def _run_stream(data: bytes, tmp_path: Path) -> tuple[Outcome, int, str]:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        result = run(RunSpec(["true"]), StreamTransport(data), stdout_fd=devnull, stderr_fd=devnull,
                     ledger_path=str(tmp_path / "ledger.sqlite"))
    finally:
        os.close(devnull)
    return result.outcome, result.exit_code, result.message


@pytest.mark.timeout(30)
def test_a_five_byte_event_claiming_gigabytes_is_unavailable_without_allocating(tmp_path: Path) -> None:
    # The attack: a tiny event whose payload says "a list of 2**28 items"
    # (marshal, protocol 1's format, allocated 2 GB for it). Decoded in a
    # process whose address space is capped at 512 MB: an allocation like
    # that fails there instead of passing unseen.
    code_ = (
        "import resource, os, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))\n"
        "from slotq import protocol\nfrom slotq.client.caller import run\nfrom slotq.spec import RunSpec\n"
        "from strict_fuzz import HELLO, StreamTransport\n"
        "data = protocol.MAGIC + HELLO + protocol.frame(protocol.EVENT, b'[\\xff\\xff\\xff\\x0f')\n"
        "null = os.open(os.devnull, os.O_WRONLY)\n"
        f"r = run(RunSpec(['true']), StreamTransport(data), stdout_fd=null, stderr_fd=null, "
        f"ledger_path={str(tmp_path / 'ledger.sqlite')!r})\n"
        "print(r.outcome, r.exit_code, r.message)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, "-c", code_], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("unavailable 121") and "undecodable event" in proc.stdout, proc.stdout
    # And a frame header claiming gigabytes is refused before anything is read.
    outcome, code, message = _run_stream(protocol.MAGIC + HELLO + b"V\x7f\xff\xff\xff", tmp_path)
    assert (outcome, code) == (Outcome.UNAVAILABLE, 121) and "corrupt frame" in message


@pytest.mark.timeout(30)
def test_megabytes_before_the_header_are_not_kept(tmp_path: Path) -> None:
    outcome, code, message = _run_stream(b"login banner\n" * 400_000 + protocol.MAGIC + HELLO, tmp_path)
    assert outcome is Outcome.UNAVAILABLE and "before slotq's stream" in message


@pytest.mark.timeout(30)
def test_an_unknown_outcome_or_wrong_types_are_unavailable_naming_the_host(tmp_path: Path) -> None:
    outcome, _, message = _run_stream(protocol.MAGIC + HELLO + ev("started", budget=1.0)
                                      + ev("exited", outcome="pwned", message="", phases={}), tmp_path)
    assert outcome is Outcome.UNAVAILABLE and message.startswith("host localhost:") and "pwned" in message
    outcome, _, message = _run_stream(protocol.MAGIC + HELLO + ev("slot", slot=["x"], waited_s=0, budget=1),
                                      tmp_path)
    assert outcome is Outcome.UNAVAILABLE and "slot is list" in message


@pytest.mark.timeout(30)
def test_passed_for_a_command_never_shown_starting_is_not_believed(tmp_path: Path) -> None:
    data = protocol.MAGIC + HELLO + ev("exited", outcome="passed", exit_code=0, message="ok", phases={})
    outcome, code, message = _run_stream(data, tmp_path)
    assert (outcome, code) == (Outcome.UNAVAILABLE, 121) and "never showed starting" in message
    honest = protocol.MAGIC + HELLO + ev("started", budget=1.0) + ev("exited", outcome="passed", exit_code=0,
                                                                     message="ok", phases={})
    assert _run_stream(honest, tmp_path)[:2] == (Outcome.PASSED, 0)  # the check refuses only the lie


# ---------------------------------------------------------------- requests and options

BAD_REQUESTS = [
    ('{"argv": ["true"], "budget": NaN}', "NaN is not JSON"),
    ('{"argv": ["true"], "budget": Infinity}', "Infinity is not JSON"),
    ('{"argv": ["true"], "budget": 1e999}', "number out of range: 1e999"),
    ('{"argv": ["true"], "budget": 1e300}', "at most 2592000 seconds"),
    ('{"argv": ["true"], "budget": "10"}', "budget must be a number"),
    ('{"argv": ["true"], "kill_grace": -1}', "kill_grace must be at least 0"),
    ('{"argv": ["true"], "cwd": "/etc", "work_id": "abcdefgh12"}', "not both"),
    ('{"argv": ["true"], "cwd": "relative"}', "absolute path"),
    ('{"argv": ["tr\\u0000ue"]}', "without NUL"),
    ('{"argv": ["true"], "cls": "../x"}', "class name"),
    ('{"argv": ["true"], "run_id": "a b"}', "run_id must be"),
    ('[' * 5000, "nested too deeply"),
    ('{"argv": []}', "non-empty list"),
    ('{"argv": ["true"], "quiet": "yes"}', "quiet must be true or false"),
    ('{"argv": ["true"], "submitted": "now"}', "submitted must be a time in epoch seconds"),
    ('{"argv": ["true"], "submitted": true}', "submitted must be a time in epoch seconds"),
    ('{"argv": ["true"], "submitted": 1e12}', "submitted must be a time in epoch seconds"),
    ('{"argv": ["true"], "bind": "a,b"}', "bind must be a list of at most 64 host names"),
    ('{"argv": ["true"], "bind": ["a\\n"]}', "bind must be a list"),
    ('{"argv": ["true"], "bind": [' + ', '.join(['"h"'] * 65) + ']}', "bind must be a list"),
    ('{"argv": ["true"], "kept": -1}', "kept"),
    ('{"argv": ["true"], "kept": "15m"}', "kept"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("line,needle", BAD_REQUESTS)
def test_a_bad_request_is_one_line_and_exit_64(state_dir: Path, line: str, needle: str) -> None:
    proc = subprocess.run(slotq_cmd() + ["host", "run", "--request-stdin"], input=line + "\n", capture_output=True,
                          text=True, timeout=20)
    assert proc.returncode == 64, proc.stderr
    assert needle in one_line(proc) and "bad run request" in proc.stderr
    assert proc.stdout == ""  # nothing was queued, nothing ran


@pytest.mark.timeout(30)
def test_a_request_naming_a_missing_work_dir_is_a_usage_error_before_the_line(state_dir: Path,
                                                                               tmp_path: Path) -> None:
    req = json.dumps({"argv": ["true"], "cwd": str(tmp_path / "nope")}) + "\n"
    proc = subprocess.run(slotq_cmd() + ["host", "run", "--request-stdin"], input=req.encode(),
                          capture_output=True, timeout=20)
    events = [p for k, p in protocol.Decoder().feed(proc.stdout) if k == protocol.EVENT]
    errors = [e for e in events if isinstance(e, dict) and e["event"] == "error"]
    assert errors and errors[0]["kind"] == "usage" and "is not a directory" in str(errors[0]["message"])
    assert not (state_dir / "tickets" / "shared").exists() or not os.listdir(state_dir / "tickets" / "shared")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("opt", ["--budget=3000000h", "--max-wait=99999999", "--kill-grace=99999999h",
                                 "--report-every=" + "9" * 400, "--report-every=1ms"])
def test_out_of_range_options_are_one_line_and_exit_64(state_dir: Path, opt: str) -> None:
    proc = subprocess.run(slotq_cmd() + ["run", opt, "--", "true"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 64
    assert "30 days" in one_line(proc) or "cannot read" in proc.stderr or "shorter than the minimum" in proc.stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args,needle", [
    # `--host "$HOST"` with HOST unset ran here instead, exit 0
    (["run", "--host", "", "--", "true"], "option --host: no host named"),
    (["status", "--host", " , "], "option --host: no host named"),
    (["cancel", "--host", "", "--mine"], "option --host: no host named"),
    (["run", "--host", "127.0.0.1", "--remote-slotq", " ", "--", "true"], "option --remote-slotq: an empty command"),
    # `--json "$OUT"` with OUT unset: the run ran, and its result was written nowhere
    (["run", "--json", "", "--", "true"], "--json needs a file name (or - for stdout), not an empty one"),
    (["task", "--budget", "5", "--json", "", "--", "true"], "--json needs a file name"),
    (["report", "--html", ""], "--html needs a file name"),
    (["run", "--credit-dir", "", "--", "true"], "--credit-dir needs a directory, not an empty name"),
    (["waits", "--dir", ""], "--dir needs a directory, not an empty name"),
    (["cancel", ""], "'' is not a run id"),  # was "the command name is empty"
    # `--prepare "$P"` with P unset: the command ran unprepared
    (["run", "--prepare", " ", "--", "true"], "option --prepare: an empty command"),
])
def test_an_empty_value_is_refused_in_one_line_not_taken_as_unset(state_dir: Path, args: list[str],
                                                                  needle: str) -> None:
    proc = subprocess.run(slotq_cmd() + args, capture_output=True, text=True, timeout=20)
    assert proc.returncode == 64, proc.stderr
    assert needle in one_line(proc)


@pytest.mark.parametrize("args", [["run", "--", "true"], ["task", "--budget", "1m", "--", "true"], ["waits"],
                                  ["host", "run", "--", "true"]])
@pytest.mark.timeout(30)
def test_a_vanished_current_directory_is_one_line(state_dir: Path, tmp_path: Path, args: list[str]) -> None:
    # task and waits said only "No such file or directory" (exit 71).
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.Popen(["sh", "-c", f'cd {gone} && rmdir {gone} && exec "$@"', "sh", *slotq_cmd(), *args],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 64 and out == "", (out, err)
    assert err == f"slotq {args[0]}: error: the current directory no longer exists: cd somewhere that does\n"


# ---------------------------------------------------------------- slots and tickets

def test_a_slot_file_replaced_under_a_waiter_is_not_leased_stale(tmp_path: Path) -> None:
    """The waiter holds its probe descriptors open; the file at the path is
    replaced and the new one is held: the stale inode is free, but leasing
    it would let two runs hold one slot."""
    probe = SlotProbe(str(tmp_path), "shared", 1)
    path = slot_path(str(tmp_path), "shared", 0)
    os.rename(path, path + ".old")  # what `rm` + a new file would do
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the slot's new holder
    try:
        assert probe.try_lease() is None
        fcntl.flock(fd, fcntl.LOCK_UN)
        lease = probe.try_lease()
        assert lease is not None and os.fstat(lease.fd).st_ino == os.stat(path).st_ino
        lease.release()
    finally:
        os.close(fd)
        probe.close()


def test_ticket_numbers_keep_rising_when_a_line_empties(tmp_path: Path) -> None:
    seqs = []
    for _ in range(3):
        t = take_ticket(str(tmp_path), "shared", {})
        seqs.append(t.seq)
        t.withdraw()  # the line is empty again
    assert seqs == sorted(seqs) and len(set(seqs)) == 3  # (each the microsecond it was taken: ticket.py)
    (tmp_path / "seq").write_text("garbage")
    t = take_ticket(str(tmp_path), "shared", {})
    keep = take_ticket(str(tmp_path), "shared", {})
    (tmp_path / "seq").write_text("0\n")  # rewritten while a ticket waits
    late = take_ticket(str(tmp_path), "shared", {})
    assert late.seq > keep.seq > t.seq
    for x in (t, keep, late):
        x.withdraw()


ODD_VALUES: list[object] = [2**63 - 1, -2**63, 1e308, -1e308, -1, 0, True, "x", [], {"a": [1]}, None, 1e11]
RECORD_FIELDS = ["since", "pid", "pid_start", "keeper", "keeper_start", "cmd", "cmd_start", "budget", "grace",
                 "uid", "run_id", "label", "cls", "host", "phase"]


@pytest.mark.timeout(120)
def test_any_json_value_in_a_ticket_or_holder_record_is_survived(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user writes their ticket and holder record (issue 11): every
    field of either, set to any JSON value, is read as that value or as
    unknown by status, the orphan check and the burial of a dead ticket --
    never an exception (each raised in `status` and in a waiting run)."""
    from slotq import history
    from slotq.host import status
    from slotq.config import HostConfig
    from slotq.host import orphans
    from slotq.host.slot import read_slot
    from slotq.host.line import pool_dir, probe

    monkeypatch.delenv("SLOTQ_CONFIG", raising=False)
    state = str(tmp_path)
    config = HostConfig.load(state_dir=state)
    slots = SlotProbe(state, "shared", 1)
    lease = slots.try_lease()
    assert lease is not None
    now = time.time()
    try:
        for field in RECORD_FIELDS:
            for value in ODD_VALUES:
                record = {"run_id": "abc123", "label": "b's run", "pid": 1, "cls": "shared", "phase": "running",
                          "since": now, "budget": 60, field: value}
                text = json.dumps(record).encode()
                os.pwrite(lease.fd, text, 0)
                os.ftruncate(lease.fd, len(text))
                live = take_ticket(state, "shared", record)
                dead = os.path.join(pool_dir(state, "shared"), f"{live.seq - 1:016d}.t")
                with open(dead, "wb") as f:
                    f.write(text)
                try:
                    snap = status.snapshot(state, config, now)  # buries the dead ticket too
                    assert not os.path.exists(dead), (field, value)
                    info = read_slot(state, "shared", 0)[1]
                    assert info is not None and orphans.end_orphan(state, info, 0.1, "test") == [], (field, value)
                    with open(dead, "wb") as f:
                        f.write(text)
                    assert probe(dead) is False, (field, value)
                finally:
                    live.withdraw()
                pools = snap["pools"]
                assert isinstance(pools, list) and [p["pool"] for p in pools] == ["shared", "landing"]
        assert len(history.recent(state, 1000)) == 2 * len(RECORD_FIELDS) * len(ODD_VALUES)
    finally:
        lease.release()
        slots.close()


# ---------------------------------------------------------------- the wait ledger's spool

@pytest.mark.timeout(30)
def test_a_bad_spool_line_is_set_aside_and_counted_never_a_jam(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from slotq.client.ledger import Ledger, spool_path

    path = str(tmp_path / "ledger.sqlite")
    monkeypatch.setenv("SLOTQ_LEDGER", path)
    good = {"op": "open", "key": "k1", "run_id": "r", "pid": 1, "pid_start": None, "workdir": str(tmp_path),
            "host": "h", "kind": "queue", "start": 100.0}
    with open(spool_path(path), "w") as f:
        f.write("[" * 5000 + "\n")
        f.write(json.dumps({"op": "open", "key": "k2", "kind": "queue", "start": "x"}) + "\n")
        f.write(json.dumps(good) + "\n")
    ledger = Ledger(path)
    assert ledger.ingest() == 1
    assert ledger.set_aside() == 2
    assert [r.run_id for r in ledger.records(str(tmp_path))] == ["r"]
    assert os.path.getsize(spool_path(path)) == 0  # emptied: the next ingest is not jammed
    ledger.close()
    proc = subprocess.run(slotq_cmd() + ["waits", "--dir", str(tmp_path), "--since", "1970-01-02T00:00"],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0 and "2 unreadable line(s)" in proc.stdout, proc.stdout + proc.stderr


NO_PROCESS_PIDS = (0, -1, 2 ** 31, 2 ** 63 - 1)


@pytest.mark.timeout(30)
def test_a_wait_of_a_pid_no_process_can_have_is_never_a_jam_nor_in_progress(tmp_path: Path) -> None:
    from slotq.client.ledger import Ledger, spool_path

    path = str(tmp_path / "ledger.sqlite")
    now = time.time()
    # Spooled: set aside like any other unreadable line.
    with open(spool_path(path), "w") as f:
        for n, pid in enumerate(NO_PROCESS_PIDS):
            f.write(json.dumps({"op": "open", "key": f"s{n}", "run_id": f"spooled{n}", "pid": pid, "pid_start": None,
                                "workdir": str(tmp_path), "host": "h", "kind": "queue", "start": now - 100}) + "\n")
    ledger = Ledger(path)
    assert ledger.ingest() == 0 and ledger.set_aside() == len(NO_PROCESS_PIDS)
    # Already in the table (an earlier slotq took them in): an open wait of
    # such a pid is a dead waiter's, ended at its last heartbeat.
    for n, pid in enumerate(NO_PROCESS_PIDS):
        wait = ledger.open_wait(run_id=f"kept{n}", workdir=str(tmp_path), host="h", kind="queue", start=now - 100,
                                pid=pid)
        ledger.heartbeat(wait, now - 40)
    ledger.close()
    proc = subprocess.run(slotq_cmd() + ["waits", "--dir", str(tmp_path), "--json"], capture_output=True, text=True,
                          timeout=20, env=dict(os.environ, SLOTQ_LEDGER=path))
    assert proc.returncode == 0, one_line(proc)
    credit = json.loads(proc.stdout)
    assert credit["in_progress"] == []
    assert sorted(w["run_id"] for w in credit["waits"]) == [f"kept{n}" for n in range(len(NO_PROCESS_PIDS))]
    assert {(w["closed_by"], w["seconds"]) for w in credit["waits"]} == {("heartbeat", 60)}


# ---------------------------------------------------------------- full disks and --json

@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs of our own (unmounted at the end)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill(d: Path) -> None:
    with open(d / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


@pytest.mark.timeout(60)
def test_a_full_state_dir_is_exit_73_in_one_line(tiny_fs: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOTQ_STATE_DIR", str(tiny_fs / "state"))
    _fill(tiny_fs)
    marker = tmp_path / "ran"
    proc = subprocess.run(slotq_cmd() + ["run", "--", "touch", str(marker)], capture_output=True, text=True,
                          timeout=20)
    assert proc.returncode == 73, proc.stderr
    assert "No space left on device" in one_line(proc)
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_a_json_result_that_cannot_be_written_leaves_no_partial_file(state_dir: Path, tiny_fs: Path,
                                                                      tmp_path: Path) -> None:
    # An unwritable place: a usage error before the run, nothing runs.
    marker = tmp_path / "ran"
    proc = subprocess.run(slotq_cmd() + ["run", "--json", str(tmp_path / "no" / "r.json"), "--", "touch",
                                         str(marker)], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 64 and "cannot write --json file" in one_line(proc) and not marker.exists()
    # A disk that fills up during the run: one line, the old result untouched.
    result = tiny_fs / "r.json"
    result.write_text('{"old": true}\n')
    proc = subprocess.run(slotq_cmd() + ["run", "--json", str(result), "--", "python3", "-c",
                                         f"""
f = open({str(tiny_fs / 'filler')!r}, 'wb')
try:
    while True:
        f.write(b'\\0' * 65536); f.flush()
except OSError:
    pass
"""], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "could not write the --json result" in proc.stderr and "Traceback" not in proc.stderr
    assert result.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["filler", "r.json"]  # no temp file left
    # /dev/full: the same one line.
    proc = subprocess.run(slotq_cmd() + ["run", "--json", "/dev/full", "--", "true"], capture_output=True,
                          text=True, timeout=20)
    assert proc.returncode == 0 and "could not write the --json result to /dev/full" in proc.stderr
    assert "Traceback" not in proc.stderr
