"""The durable run history: spool + monthly segments, the per-user index,
`slotq history`, and `status --history N` reading all of it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Start, live_tickets, slotq_cmd, start_holder, wait_for
from slotq import history
from slotq.history.index import Index

DAY = 86400.0


def record(i: int, ended: float, **extra: object) -> dict[str, object]:
    phases: dict[str, float | None] = {"submitted": ended - 10, "slot": ended - 5, "started": ended - 5,
                                       "ended": ended}
    rec = history.run_record(run_id=f"run{i:07d}", label=f"job {i}", cls="shared", host="h",
                             outcome="passed" if i % 3 else "failed", exit_code=0 if i % 3 else 1,
                             message="", phases=phases, pool="shared", slot="shared#0",
                             ticket=None, budget=None, kept=None)
    rec.update(extra)
    return rec


def rotate(state_dir: Path) -> None:
    """Move our spool on to a segment, as a writer that finds it full does
    (a rename)."""
    spool = Path(history.spool_path(str(state_dir)))
    assert spool.exists()
    spool.rename(spool.parent / f"u{os.getuid()}-{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(4).hex()}.jsonl")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.mark.timeout(60)
def test_every_run_is_kept_past_the_spool_size_and_status_history_n_reads_them_all(
        state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "SPOOL_BYTES", 8192)  # ~25 runs: the spool moves to its segment often
    state_dir.mkdir()
    now = time.time()
    for i in range(300):
        history.append(str(state_dir), record(i, now - 300 + i))
    assert history.segment_files(str(state_dir)), "the spool was never moved to a segment"
    assert os.path.getsize(history.spool_path(str(state_dir))) <= 8192 + 1024
    got = history.recent(str(state_dir), 1000)
    assert [r["run_id"] for r in got] == [f"run{i:07d}" for i in range(300)]
    proc = cli("status", "--json", "--history", "1000")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["history"]) == 300
    proc = cli("history", "--json", "--since", "1h")
    assert proc.returncode == 0, proc.stderr
    assert [r["run_id"] for r in json.loads(proc.stdout)] == [f"run{i:07d}" for i in range(300)]


@pytest.mark.timeout(60)
def test_a_run_with_two_lines_is_shown_once_as_its_later_line_says(state_dir: Path) -> None:
    # A Slurm run can have two: its node's runner's (`failed`, exit 143),
    # then its relay's (`cancelled`: Slurm cancelled the job). `status`
    # showed both, while `history` showed the later.
    state_dir.mkdir()
    now = time.time()
    history.append(str(state_dir), record(1, now - 20))
    history.append(str(state_dir), record(2, now - 10, outcome="failed", exit_code=143))
    history.append(str(state_dir), record(2, now - 9, outcome="cancelled", exit_code=None))
    proc = cli("status", "--json", "--history", "10")
    assert proc.returncode == 0, proc.stderr
    assert [(r["run_id"], r["outcome"]) for r in json.loads(proc.stdout)["history"]] == [
        ("run0000001", "passed"), ("run0000002", "cancelled")]
    proc = cli("history", "--json")
    assert [(r["run_id"], r["outcome"]) for r in json.loads(proc.stdout)] == [
        ("run0000001", "passed"), ("run0000002", "cancelled")]


@pytest.mark.timeout(60)
def test_history_lists_real_runs_with_phases_and_filters_including_a_run_cancelled_in_line(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    queued = runs("--label", "gave up", "--", "true", name="queued")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the second run in line")
    in_line_from = time.time()
    wait_for(lambda: time.time() - in_line_from > 0.5, what="half a second in line")
    queued.proc.send_signal(signal.SIGINT)
    assert queued.wait() == 130
    gate.touch()
    assert holder.wait() == 0
    assert runs("--label", "bad one", "--class", "landing", "--", "false", name="bad").wait() == 1
    proc = cli("history", "--json")
    assert proc.returncode == 0, proc.stderr
    got = {r["label"]: r for r in json.loads(proc.stdout)}
    assert set(got) == {"placeholder", "gave up", "bad one"}
    gave_up = got["gave up"]
    assert (gave_up["outcome"], gave_up["blame"], gave_up["slot"]) == ("cancelled", "caller", None)
    assert gave_up["waited_s"] >= 0.5 and gave_up["phases"]["submitted"] is not None
    assert gave_up["phases"]["started"] is None and gave_up["ran_s"] is None
    bad = got["bad one"]
    assert (bad["outcome"], bad["exit_code"], bad["class"], bad["slot"]) == ("failed", 1, "landing", "landing#0")
    assert bad["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert all(bad["phases"][k] is not None for k in ("submitted", "slot", "started", "ended"))
    # The same vocabulary as `run --json`.
    res = json.loads((tmp_path / "bad.json").read_text())
    assert res["run_id"] == bad["run_id"] and set(res["phases"]) >= set(bad["phases"])
    assert "class" in res and "class" in bad
    for args, labels in ((["--outcome", "failed"], {"bad one"}), (["--label", "gave"], {"gave up"}),
                         # A pattern, as cancel --label takes: the whole label.
                         (["--label", "*one"], {"bad one"}), (["--label", "gav*"], {"gave up"}),
                         (["--label", "?lace*"], {"placeholder"}), (["--label", "gave?"], set()),
                         (["--label", "[bg]a*"], {"bad one", "gave up"}),
                         (["--class", "landing"], {"bad one"}), (["--user", "nobody-such"], set()),
                         (["--user", str(bad["user"])], {"placeholder", "gave up", "bad one"}),
                         (["--limit", "1"], {"bad one"}),
                         # sacct's lists: any of them.
                         (["--outcome", "failed,cancelled"], {"bad one", "gave up"}),
                         (["--class", " landing, nosuch"], {"bad one"}),
                         (["--user", f"nobody-such,{bad['user']}", "--outcome", "passed"], {"placeholder"})):
        proc = cli("history", "--json", *args)
        assert {r["label"] for r in json.loads(proc.stdout)} == labels, args
    text = cli("history").stdout
    assert text.splitlines()[0].split()[:4] == ["RUN_ID", "USER", "CLASS", "SLOT"]
    assert "gave up" in text and text.endswith("3 run(s)\n")


@pytest.mark.timeout(60)
def test_a_run_killed_last_in_line_is_in_history_and_report_at_once(state_dir: Path, runs: Start,
                                                                    tmp_path: Path) -> None:
    # The last in a line, waiting by itself (a --prepare run keeps no
    # standby keeper), SIGKILLed: its ticket stayed until a run came behind
    # it or someone ran `slotq status`, and until then `slotq history` and
    # `report` did not list the run, ended minutes ago.
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)

    def killed_in_line(label: str) -> None:
        run = runs("--label", label, "--prepare", "true", "--", "true", name=label.replace(" ", "-"))
        wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the run in line")
        run.kill()

    killed_in_line("killed first")
    page = tmp_path / "runs.html"
    proc = cli("report", "--html", str(page))
    assert proc.returncode == 0 and ": 1 run(s) from " in proc.stderr, proc.stderr
    assert "killed first" in page.read_text()
    killed_in_line("killed next")
    proc = cli("history", "--json")
    assert proc.returncode == 0, proc.stderr
    got = {r["label"]: r for r in json.loads(proc.stdout)}
    assert set(got) == {"killed first", "killed next"}
    assert (got["killed next"]["outcome"], got["killed next"]["slot"]) == ("caller_gone", None)
    gate.touch()
    assert holder.wait() == 0


@pytest.mark.parametrize("args, what", [
    (["--outcome", "nope"], "--outcome 'nope' is not an outcome"),
    (["--since", "yesterday-ish"], "--since"),
    (["--since", "1h", "--until", "2h"], "--until is not after --since: the window "),
    (["--since", "0"], "is empty (a bare number below 1e9 is seconds ago"),  # `0` is now, not 1970
    (["--until", "inf"], "--until: 'inf' is beyond the year 9999"),
    (["--since", "x" * 5000], "--since: cannot read 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' as a time"),  # cut
    (["--limit", "0"], "--limit"),
    # `--user "$U"` with U unset listed nothing, as if the user had no runs.
    (["--user", ""], "option --user: no user named"),
    (["--class", " , "], "option --class: no class named"),
    (["--label", " "], "option --label: an empty label"),  # `--label "$L"` with L unset listed every run
    (["--outcome", "passed,nope"], "--outcome 'nope' is not an outcome"),
    # As `status --slurm` and `cancel --slurm` take it: say where Slurm runs are.
    (["--slurm"], "unknown option --slurm: a run through Slurm is in the history like any other"),
])
@pytest.mark.timeout(30)
def test_bad_history_arguments_are_one_line_exit_64(state_dir: Path, args: list[str], what: str) -> None:
    proc = cli("history", *args)
    assert proc.returncode == 64 and what in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


@pytest.mark.timeout(30)
def test_a_limit_larger_than_any_count_means_all(state_dir: Path) -> None:
    """`--limit 99999999999999999999999` was "cannot read the run history:
    datatype mismatch" (exit 73, SQLite's integers end at 2**63)."""
    assert cli("run", "-q", "--", "true").returncode == 0
    for args in (["history", "--limit", "9" * 23], ["status", "--history", "9" * 5000]):
        proc = cli(*args)
        assert proc.returncode == 0 and proc.stderr == "", (args[:2], proc.stderr[:300])
    assert cli("history", "--limit", "9" * 23).stdout.endswith("1 run(s)\n")
    proc = cli("history", "--limit", "x" * 5000)
    assert proc.returncode == 64 and len(proc.stderr) < 200, proc.stderr[:300]  # the value is cut in the message


@pytest.mark.timeout(60)
def test_the_index_catches_up_incrementally_without_duplicates_when_the_spool_moves(
        state_dir: Path, tmp_path: Path) -> None:
    state_dir.mkdir()
    now = time.time()
    for i in range(10):
        history.append(str(state_dir), record(i, now - 100 + i))
    index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / "idx.sqlite"))
    assert index.catch_up() == 10
    assert index.catch_up() == 0  # nothing new: nothing read
    rotate(state_dir)  # the spool moves on to a segment; a new one is made
    for i in range(10, 15):
        history.append(str(state_dir), record(i, now - 100 + i))
    index.catch_up()
    ids = [r["run_id"] for r in index.query()]
    assert ids == [f"run{i:07d}" for i in range(15)]
    # A window: runs that overlap it, by their phases.
    assert [r["run_id"] for r in index.query(since=now - 92.5, until=now - 88.5)] == \
        [f"run{i:07d}" for i in range(8, 15)]  # ended >= since, submitted (ended - 10) <= until
    index.close()


@pytest.mark.timeout(60)
def test_the_index_forgets_the_runs_of_a_state_dir_removed_or_made_again(state_dir: Path, tmp_path: Path) -> None:
    # The index (beside the user's ledger) outlived its state dir: after
    # `rm -rf` of it (or a reboot's /tmp), `slotq history` went on listing
    # runs whose history was gone, under those of the new one.
    def runs_indexed() -> list[object]:
        index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / "idx.sqlite"))
        try:
            index.catch_up()
            return [r["run_id"] for r in index.query()]
        finally:
            index.close()

    state_dir.mkdir()
    now = time.time()
    for i in range(3):
        history.append(str(state_dir), record(i, now - 100 + i))
    rotate(state_dir)  # three of them in a segment, one in the spool
    history.append(str(state_dir), record(3, now - 90))
    assert runs_indexed() == ["run0000000", "run0000001", "run0000002", "run0000003"]
    shutil.rmtree(state_dir)  # and made again at once: the same path, maybe the same inode numbers
    state_dir.mkdir()
    history.append(str(state_dir), record(7, now - 50))
    assert runs_indexed() == ["run0000007"]
    shutil.rmtree(state_dir)
    assert runs_indexed() == []  # gone: nothing to show


@pytest.mark.timeout(60)
def test_the_runs_of_a_spool_moved_on_stay_listed_from_the_segment_they_moved_to(
        state_dir: Path, tmp_path: Path) -> None:
    # The index drops what it read from a spool found replaced; the lines
    # are in the segment it was renamed to, so none may go missing.
    state_dir.mkdir()
    now = time.time()
    index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / "idx.sqlite"))
    history.append(str(state_dir), record(0, now - 100))
    rotate(state_dir)  # a segment exists, and is read below
    history.append(str(state_dir), record(1, now - 99))  # read from the spool
    history.append(str(state_dir), {"label": "no run id", "outcome": "passed", "phases": {"ended": now - 98}})
    index.catch_up()
    assert [r["label"] for r in index.query()] == ["job 0", "job 1", "no run id"]
    rotate(state_dir)  # both move on, after the index read the first segment
    history.append(str(state_dir), record(2, now - 97))
    index.catch_up()
    assert [r["label"] for r in index.query()] == ["job 0", "job 1", "no run id", "job 2"]  # none twice
    index.close()


@pytest.mark.timeout(60)
def test_an_index_an_older_slotq_kept_is_rebuilt_not_a_crash(state_dir: Path, tmp_path: Path) -> None:
    # Schema 2 had no `src` column: making today's index over it failed
    # ("no such column: src") before the version was even looked at.
    import sqlite3

    state_dir.mkdir()
    history.append(str(state_dir), record(1, time.time() - 10))
    old = sqlite3.connect(tmp_path / "idx.sqlite")
    old.executescript("""
        CREATE TABLE runs (key TEXT PRIMARY KEY, run_id TEXT, ended REAL NOT NULL, first REAL NOT NULL);
        CREATE TABLE files (name TEXT PRIMARY KEY, ino INTEGER, off INTEGER, head BLOB);
        CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT);
        INSERT INTO meta VALUES ('schema', '2');
        INSERT INTO runs VALUES ('stale', 'stale', 1.0, 1.0);""")
    old.commit()
    old.close()
    index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / "idx.sqlite"))
    index.catch_up()
    assert [r["run_id"] for r in index.query()] == ["run0000001"]
    index.close()


@pytest.mark.timeout(60)
def test_readers_never_miss_a_run_while_writers_move_the_spool(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The index drops the rows of a spool found emptied and reads them back
    # from the segment they moved to, in the same step: a reader between
    # a move and the next must never see fewer runs than before, or any twice.
    # It found a race older than that: a reader that took the spool's size
    # and first bytes across a move resumed the new spool at the old one's
    # offset, and never saw its first runs (4 runs in 15 on a busy machine,
    # until the spool was read under the writers' shared lock; each user's
    # spool is now renamed to a segment, never emptied).
    import threading

    monkeypatch.setattr(history, "SPOOL_BYTES", 4096)  # a move every ~12 runs
    state_dir.mkdir()
    now = time.time()
    total = 1500
    done = threading.Event()

    def write(k: int) -> None:
        for i in range(k, total, 3):
            history.append(str(state_dir), record(i, now - total + i))

    writers = [threading.Thread(target=write, args=(k,)) for k in range(3)]
    for w in writers:
        w.start()
    seen = 0
    index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / "idx.sqlite"))
    try:
        while not done.is_set():
            done.set() if not any(w.is_alive() for w in writers) else None
            index.catch_up()
            ids = [r["run_id"] for r in index.query()]
            assert len(ids) == len(set(ids)), "a run listed twice"
            assert len(ids) >= seen, f"{seen - len(ids)} run(s) went missing"
            seen = len(ids)
    finally:
        index.close()
    assert seen == total and history.segment_files(str(state_dir))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("listing", ["between the listing and the read", "during the listing"])
def test_a_spool_moved_while_the_index_reads_loses_no_run(
        listing: str, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The race the test above found once in a CI run (1 run in 61 missing for
    # one query): the spool was renamed to its segment after the directory
    # was listed, so the index found a new spool under the old name, dropped
    # the old one's rows, and had no segment in its listing to read them
    # back from. A directory listed while a rename happens may also show
    # neither name. Both are made to happen here, once each, on purpose.
    state_dir.mkdir()
    now = time.time()
    index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / "idx.sqlite"))
    history.append(str(state_dir), record(0, now - 10))
    history.append(str(state_dir), record(1, now - 9))
    index.catch_up()
    assert [r["run_id"] for r in index.query()] == ["run0000000", "run0000001"]
    real = history.history_files
    moves: list[int] = []

    def listing_then_a_move(state: str, notes: list[str] | None = None) -> list[history.HistoryFile]:
        files = real(state, notes)
        if not moves:
            moves.append(1)
            rotate(state_dir)
            history.append(str(state_dir), record(2, now - 8))  # a new spool under the old name
            if listing == "during the listing":
                files = [f for f in files if not f.spool]
        return files

    monkeypatch.setattr(history, "prune", lambda *args: [])  # it lists the files too: the index's listing is the one
    monkeypatch.setattr(history, "history_files", listing_then_a_move)
    index.catch_up()
    assert [r["run_id"] for r in index.query()] == ["run0000000", "run0000001", "run0000002"]
    index.close()


@pytest.mark.timeout(60)
def test_corrupt_lines_are_skipped_and_counted_never_a_crash(state_dir: Path, tmp_path: Path) -> None:
    state_dir.mkdir()
    now = time.time()
    history.append(str(state_dir), record(1, now))
    with open(history.spool_path(str(state_dir)), "ab") as f:
        f.write(b"[" * 100_000 + b"\n")  # deeper than any parser should go
        f.write(b'{"run_id": "' + b"x" * 200_000 + b'"}\n')  # too long
        f.write(b"\xff\xfe not json\n")
        f.write(b'{"run_id": "no-end", "phases": {"ended": "soon"}}\n')
        # Well-formed, but values no slotq writes: read as unknown.
        f.write(b'{"run_id": "odd", "exit_code": 1%s, "uid": 1%s, "label": ["x"], "waited_s": NaN, '
                b'"phases": {"submitted": Infinity, "ended": %r}}\n' % (b"0" * 19, b"0" * 19, now))
    history.append(str(state_dir), record(2, now))
    index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / "idx.sqlite"))
    index.catch_up()
    got = index.query()
    assert [r["run_id"] for r in got] == ["run0000001", "odd", "run0000002"]
    assert [got[1][k] for k in ("exit_code", "label", "waited_s")] == [None, None, None]
    assert index.skipped == 4
    index.close()
    # The status view shows any JSON object (the one without an end too).
    assert [r["run_id"] for r in history.recent(str(state_dir), 10)] == ["run0000001", "no-end", "run0000002"]
    proc = cli("history")
    assert proc.returncode == 0 and "3 run(s)" in proc.stdout
    assert "4 corrupt line(s)" in proc.stderr


@pytest.mark.timeout(60)
def test_a_command_that_is_not_utf8_is_listed_and_stops_neither_history_nor_report(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Its argument reached the history index as a lone surrogate, which
    # SQLite refuses: `slotq history` and `slotq report` failed with a
    # traceback for every user of the host until the record aged out.
    assert runs("--", "true", os.fsdecode(b"\xff\xfe"), name="bytes").wait() == 0
    with open(history.history_path(str(state_dir)), "ab") as f:  # as an older slotq wrote one
        f.write(json.dumps(record(1, time.time() + 1, label="old \udcff")).encode() + b"\n")
    proc = cli("history", "--json")
    assert proc.returncode == 0, proc.stderr
    labels = [r["label"] for r in json.loads(proc.stdout)]
    assert len(labels) == 2 and labels[0].endswith(": true \\xff\\xfe") and labels[1] == "old \\xff", labels
    for args, found in ((["--label", os.fsdecode(b"\xff")], labels), (["--user", os.fsdecode(b"\xff")], [])):
        proc = cli("history", "--json", *args)  # a filter that is not UTF-8 failed in SQLite
        assert proc.returncode == 0 and [r["label"] for r in json.loads(proc.stdout)] == found, proc.stderr
    page = tmp_path / "runs.html"
    proc = cli("report", "--html", str(page), "--since", "1h")
    assert proc.returncode == 0 and "old \\\\xff" in page.read_text(), proc.stderr


@pytest.mark.timeout(60)
def test_history_and_report_work_where_the_index_cannot_be_kept(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A service account whose HOME does not exist: the index (a cache beside
    # the wait ledger) could not be made, and `history` and `report` failed
    # (exit 73), the history itself readable all along.
    state_dir.mkdir()
    history.append(str(state_dir), record(1, time.time()))
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SLOTQ_LEDGER", str(blocker / "ledger.sqlite"))
    proc = cli("history", "--json")
    assert proc.returncode == 0 and [r["run_id"] for r in json.loads(proc.stdout)] == ["run0000001"], proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("slotq: note: the history index cannot be kept (")
    assert str(blocker) in lines[0] and "set SLOTQ_LEDGER or XDG_STATE_HOME" in lines[0]
    proc = cli("report", "--html", str(tmp_path / "runs.html"))
    assert proc.returncode == 0 and "job 1" in (tmp_path / "runs.html").read_text(), proc.stderr


@pytest.mark.timeout(60)
def test_retention_drops_old_runs_and_old_segments(state_dir: Path, tmp_path: Path) -> None:
    state_dir.mkdir()
    now = time.time()
    seg_dir = Path(history.segments_dir(str(state_dir)))
    seg_dir.mkdir()
    old = seg_dir / "2001-01.jsonl"
    old.write_text(json.dumps(record(1, 978_307_200 + 3600)) + "\n")
    history.append(str(state_dir), record(2, now - 40 * DAY))
    history.append(str(state_dir), record(3, now - 1 * DAY))
    # A month that ended (or ends) within the window: its segment is kept.
    within = seg_dir / time.strftime("%Y-%m.jsonl", time.gmtime(now - 25 * DAY))
    with open(within, "a") as f:
        f.write(json.dumps(record(4, now - 25 * DAY)) + "\n")
    # Our own segments: by their last write.
    mine_old, mine_new = seg_dir / f"u{os.getuid()}-20010101T000000-00000000.jsonl", \
        seg_dir / f"u{os.getuid()}-20010101T000000-00000001.jsonl"
    mine_old.write_text(json.dumps(record(5, now - 40 * DAY)) + "\n")
    os.utime(mine_old, (now - 40 * DAY, now - 40 * DAY))
    mine_new.write_text(json.dumps(record(6, now - 2 * DAY)) + "\n")
    os.utime(mine_new, (now - 2 * DAY, now - 2 * DAY))
    (state_dir / "host.toml").write_text('[history]\nretention = "30d"\n')
    proc = cli("history", "--json", "--since", "3650d")
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["run_id"] for r in json.loads(proc.stdout)) == ["run0000003", "run0000004", "run0000006"]
    assert not old.exists(), "a segment wholly past the retention is deleted"
    assert within.exists(), "a segment of a month that ended within the retention is kept"
    assert not mine_old.exists() and mine_new.exists(), "a segment of ours last written before the window goes"
    (state_dir / "host.toml").write_text('[history]\nretention = "forever"\n')
    proc = cli("history")
    assert proc.returncode == 78 and "[history] retention" in proc.stderr


@pytest.mark.timeout(120)
def test_a_window_query_over_200k_runs_takes_milliseconds(state_dir: Path, tmp_path: Path) -> None:
    state_dir.mkdir()
    seg_dir = Path(history.segments_dir(str(state_dir)))
    seg_dir.mkdir()
    now = time.time()
    n = 200_000
    start = now - 90 * DAY
    step = 90 * DAY / n
    with open(seg_dir / time.strftime("%Y-%m.jsonl", time.gmtime(now)), "w") as f:
        for i in range(n):
            f.write(json.dumps(record(i, start + i * step)) + "\n")
    index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / "idx.sqlite"))
    assert index.catch_up() == n
    times = []
    for k in range(5):
        since = start + (k + 1) * 10 * DAY
        t0 = time.perf_counter()
        got = index.query(since=since, until=since + 3600)
        times.append(time.perf_counter() - t0)
        assert 80 <= len(got) <= 100, len(got)  # one hour of a run every ~39 s
    index.close()
    assert statistics.median(times) < 0.05, times


@pytest.mark.timeout(60)
def test_a_slurm_relays_line_is_shown_whichever_of_it_and_its_nodes_came_last(
        state_dir: Path, tmp_path: Path) -> None:
    # Under load, a node's runner stopped by Slurm's cancel wrote its line
    # after the relay's, and history showed the node's word ("SIGTERM to the
    # host runner") instead of the relay's ("Ctrl-C").
    state_dir.mkdir()
    now = time.time()
    relay = record(1, now, message="cancelled (Ctrl-C) while the command ran", relay=True)
    node = record(1, now + 0.5, message="cancelled (SIGTERM to the host runner) while the command ran")
    for first, second in ((relay, node), (node, relay)):
        shutil.rmtree(state_dir, ignore_errors=True)
        state_dir.mkdir()
        history.append(str(state_dir), first)
        history.append(str(state_dir), second)
        index = Index(str(state_dir), 180 * DAY, path=str(tmp_path / f"idx-{id(first)}.sqlite"))
        index.catch_up()
        assert [r["message"] for r in index.query()] == [relay["message"]]
        index.close()
        assert [r["message"] for r in history.once_each(history.recent(str(state_dir), 10))] == [relay["message"]]
