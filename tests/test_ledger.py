"""The wait ledger on a real SQLite file, with real processes for liveness."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from slotq.client.ledger import Ledger, process_start, union_seconds

T0 = 1_800_000_000.0


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(str(tmp_path / "ledger.sqlite"))


def closed(led: Ledger, workdir: Path, start: float, end: float, **kw: object) -> int:
    wid = led.open_wait(run_id=str(kw.get("run_id", "r")), workdir=str(workdir), host="h",
                        kind=str(kw.get("kind", "queue")), start=start)
    led.close_wait(wid, end)
    return wid


def test_a_wait_straddling_the_window_is_cut_to_it(ledger: Ledger, tmp_path: Path) -> None:
    closed(ledger, tmp_path, T0 - 50, T0 + 30)      # straddles the start
    closed(ledger, tmp_path, T0 + 80, T0 + 200)     # straddles the end
    closed(ledger, tmp_path, T0 - 100, T0 - 60)     # wholly before: not there
    c = ledger.credit(str(tmp_path), since=T0, until=T0 + 100)
    assert [(w.start - T0, w.end - T0) for w in c.waits] == [(0, 30), (80, 100)]
    assert c.sum == pytest.approx(50) and c.union == pytest.approx(50)


def test_an_open_record_of_a_live_process_is_in_progress_not_credited(ledger: Ledger, tmp_path: Path) -> None:
    ledger.open_wait(run_id="live", workdir=str(tmp_path), host="h", kind="queue", start=T0)
    c = ledger.credit(str(tmp_path), since=T0 - 10, until=T0 + 40)
    assert c.waits == [] and c.sum == 0
    assert [(w.record.run_id, w.seconds) for w in c.in_progress] == [("live", 40)]


def test_overlapping_waits_sum_counts_each_union_counts_the_overlap_once(ledger: Ledger, tmp_path: Path) -> None:
    closed(ledger, tmp_path, T0, T0 + 100)
    closed(ledger, tmp_path, T0 + 50, T0 + 150)
    closed(ledger, tmp_path, T0 + 300, T0 + 310, kind="transfer")
    c = ledger.credit(str(tmp_path), since=T0, until=T0 + 1000)
    assert c.sum == pytest.approx(210)
    assert c.union == pytest.approx(160)


def test_union_seconds_merges_touching_and_nested_intervals() -> None:
    assert union_seconds([(0, 10), (10, 20), (2, 3), (30, 31)]) == 21
    assert union_seconds([]) == 0


def test_a_dead_process_open_record_ends_at_its_last_heartbeat(ledger: Ledger, tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    wid = ledger.open_wait(run_id="dead", workdir=str(tmp_path), host="h", kind="queue", start=T0, pid=p.pid)
    ledger.heartbeat(wid, T0 + 30)
    assert len(ledger.credit(str(tmp_path), T0, T0 + 100).in_progress) == 1
    p.kill()
    p.wait()
    c = ledger.credit(str(tmp_path), T0, T0 + 100)
    assert c.in_progress == []
    assert [(w.seconds, w.closed_by) for w in c.waits] == [(30, "heartbeat")]


def test_a_reused_pid_does_not_revive_a_dead_record(ledger: Ledger, tmp_path: Path) -> None:
    # Our own pid is alive, but this record belonged to an earlier process
    # that had it: its start time differs.
    me = process_start(os.getpid())
    assert me is not None
    boot, ticks = me.rsplit(":", 1)
    wid = ledger.open_wait(run_id="old", workdir=str(tmp_path), host="h", kind="queue", start=T0,
                           pid=os.getpid(), pid_start=f"{boot}:{int(ticks) - 1}")
    ledger.heartbeat(wid, T0 + 12)
    c = ledger.credit(str(tmp_path), T0, T0 + 100)
    assert c.in_progress == [] and [w.seconds for w in c.waits] == [12]


def test_waits_below_the_dir_count_and_siblings_do_not(ledger: Ledger, tmp_path: Path) -> None:
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "ab").mkdir()
    closed(ledger, tmp_path / "a", T0, T0 + 1)
    closed(ledger, tmp_path / "a" / "sub", T0, T0 + 2)
    closed(ledger, tmp_path / "ab", T0, T0 + 4)
    assert ledger.credit(str(tmp_path / "a"), T0, T0 + 10).sum == 3


WRITER = """
import sys
from slotq.client.ledger import Ledger
led = Ledger(sys.argv[1])
for i in range(int(sys.argv[3])):
    w = led.open_wait(run_id=f"{sys.argv[2]}-{i}", workdir=sys.argv[4], host="h", kind="queue", start=1e9 + i)
    led.heartbeat(w, 1e9 + i + 0.5)
    led.close_wait(w, 1e9 + i + 1)
"""


@pytest.mark.timeout(120)
def test_fifty_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.sqlite")
    Ledger(path).close()
    per = 10
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, f"w{n}", str(per), str(tmp_path)])
             for n in range(50)]
    assert [p.wait(timeout=100) for p in procs] == [0] * 50
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rows = db.execute('SELECT run_id, start, "end", heartbeat FROM waits').fetchall()
    assert len(rows) == 50 * per
    assert len({r[0] for r in rows}) == 50 * per
    assert all(end == start + 1 and hb == end for _, start, end, hb in rows)


SPOOL_WRITER = """
import sys
from slotq.client.ledger import WaitRecorder
for i in range(int(sys.argv[3])):
    r = WaitRecorder(run_id=f"{sys.argv[2]}-{i}", workdir=sys.argv[4], host="h", warn=print, path=sys.argv[1])
    r.open("queue", 1e9 + i)
    r.heartbeat(1e9 + i + 0.5)
    r.close(1e9 + i + 1)
"""


@pytest.mark.timeout(120)
def test_fifty_concurrent_runs_spooling_while_readers_ingest_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.sqlite")
    per = 10
    procs = [subprocess.Popen([sys.executable, "-c", SPOOL_WRITER, path, f"w{n}", str(per), str(tmp_path)])
             for n in range(50)]
    led = Ledger(path)
    while any(p.poll() is None for p in procs):
        led.ingest()  # readers move the spool into SQLite while runs append to it
    assert [p.wait(timeout=100) for p in procs] == [0] * 50
    c = led.credit(str(tmp_path), 0, 2e9)
    assert len(c.waits) == 50 * per and c.in_progress == []
    assert all(w.seconds == 1.0 and w.closed_by == "end" for w in c.waits)
    assert len({w.record.run_id for w in c.waits}) == 50 * per
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert os.path.getsize(path + ".spool") == 0


def test_a_spooled_wait_in_progress_is_not_credited_until_closed(tmp_path: Path) -> None:
    from slotq.client.ledger import WaitRecorder

    path = str(tmp_path / "ledger.sqlite")
    r = WaitRecorder(run_id="r", workdir=str(tmp_path), host="h", warn=print, path=path)
    r.open("queue", T0)
    r.heartbeat(T0 + 5)
    led = Ledger(path)
    c = led.credit(str(tmp_path), T0, T0 + 20)
    assert c.waits == [] and [w.record.run_id for w in c.in_progress] == ["r"]
    r.close(T0 + 12)
    c = led.credit(str(tmp_path), T0, T0 + 20)
    assert [w.seconds for w in c.waits] == [12] and c.in_progress == []


def test_a_spooled_wait_of_a_dir_that_is_not_utf8_moves_in_and_is_credited(tmp_path: Path) -> None:
    # A spool line as an older slotq wrote it: the path's byte as JSON's
    # lone-surrogate escape. SQLite refused it, and the move of the spool
    # failed for every wait behind it.
    odd = os.path.join(os.fsencode(tmp_path), b"w\xff")
    os.mkdir(odd)
    path = str(tmp_path / "ledger.sqlite")
    workdir = os.fsdecode(odd).replace("\udcff", "\\udcff")
    with open(path + ".spool", "w") as f:
        for i, w in enumerate((workdir, str(tmp_path))):
            f.write(f'{{"op": "open", "key": "r{i}:queue", "run_id": "r{i}", "pid": 1, "pid_start": "1", '
                    f'"workdir": "{w}", "host": "h", "kind": "queue", "start": {T0}}}\n'
                    f'{{"op": "close", "key": "r{i}:queue", "end": {T0 + 3}}}\n')
    led = Ledger(path)
    assert [w.record.run_id for w in led.credit(str(tmp_path), T0, T0 + 20).waits] == ["r0", "r1"]
    assert [w.record.workdir for w in led.credit(os.fsdecode(odd), T0, T0 + 20).waits] == [f"{tmp_path}/w\\xff"]


def test_waits_that_ended_past_the_retention_are_dropped_when_the_spool_moves_in(tmp_path: Path) -> None:
    import time

    from slotq.client import ledger as ledger_module
    from slotq.client.ledger import WaitRecorder

    led = Ledger(str(tmp_path / "ledger.sqlite"))
    now = time.time()
    day = 86400.0
    old = closed(led, tmp_path, now - 100 * day, now - 100 * day + 5, run_id="old")
    kept = closed(led, tmp_path, now - 10 * day, now - 10 * day + 5, run_id="kept")
    # An open wait whose last heartbeat is past the retention: its waiter died long ago.
    dead = led.open_wait(run_id="dead", workdir=str(tmp_path), host="h", kind="queue", start=now - 95 * day)
    live = led.open_wait(run_id="live", workdir=str(tmp_path), host="h", kind="queue", start=now - 100 * day)
    led.heartbeat(live, now)  # waiting for 100 days, and still beating: kept
    WaitRecorder(run_id="new", workdir=str(tmp_path), host="h", warn=print, path=led.path).open("queue", now)
    led.ingest()  # the spool moves in, and the old waits go
    ids = [r.id for r in led.records(str(tmp_path))]
    assert old not in ids and dead not in ids and {kept, live} <= set(ids) and len(ids) == 3
    assert ledger_module.RETAIN_S == 90 * day  # what the README says


def test_a_run_that_finds_the_spool_past_its_limit_moves_it_in_while_it_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With no reader (no `slotq task`, no `slotq waits`) the spool grew for
    # ever: every wait of every run, with its heartbeats.
    from slotq.client import ledger as ledger_module
    from slotq.client.ledger import WaitRecorder, spool_path

    monkeypatch.setattr(ledger_module, "SPOOL_MOVE_BYTES", 2000, raising=False)
    path = str(tmp_path / "ledger.sqlite")
    for i in range(8):  # past 2000 bytes
        r = WaitRecorder(run_id=f"r{i}", workdir=str(tmp_path), host="h", warn=print, path=path)
        r.open("transfer", T0 + i)  # a transfer's wait is the run's own time: never moves the spool
        r.close(T0 + i + 1)
    before = os.path.getsize(spool_path(path))
    assert before > 2000
    waiting = WaitRecorder(run_id="waiting", workdir=str(tmp_path), host="h", warn=print, path=path)
    waiting.open("queue", T0 + 20)
    assert os.path.getsize(spool_path(path)) == 0
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM waits").fetchone() == (9,)
    waiting.close(T0 + 30)  # its own wait goes on as before
    assert [w.seconds for w in Ledger(path).credit(str(tmp_path), T0 + 20, T0 + 40).waits] == [10]
