"""A user's waiting runs share their view of the line (lineview.py): far
back in a long line a report reads it instead of the kernel's lock table
and every ticket; near the head it is always worked out afresh; a view that
is not this user's own, fresh, well-formed file is never used."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import pytest

from conftest import Start, live_tickets, start_holder, wait_for
from slotq.host import lineview
from slotq.host.line import list_tickets, pool_dir

SLOTS: list[dict[str, object]] = [{"slot": "shared#0", "held": True, "label": "lint", "user": "alice",
                                   "held_s": 2.0, "phase": "running"}]


@pytest.mark.timeout(10)
def test_a_view_is_read_back_with_our_place_in_it_and_its_age_added(tmp_path: Path) -> None:
    now = time.time()
    lineview.write(str(tmp_path), "shared", [5, 7, 9, 11], SLOTS, now)
    path = Path(lineview.view_path(str(tmp_path), "shared"))
    assert path.stat().st_mode & 0o777 == 0o600
    got = lineview.read(str(tmp_path), "shared", 9, now + 1.5)
    assert got is not None
    ahead, waiting, slots, typical = got
    assert (ahead, waiting, typical) == (2, 4, None)
    assert slots[0]["label"] == "lint" and slots[0]["held_s"] == 3.5
    assert lineview.read(str(tmp_path), "shared", 8, now) is None  # not in it: joined since
    assert lineview.read(str(tmp_path), "shared", 9, now + lineview.MAX_AGE + 0.1) is None  # too old
    assert lineview.read(str(tmp_path), "shared", 9, now - 2) is None  # from the future
    assert lineview.read(str(tmp_path), "landing", 9, now) is None  # another pool's
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    assert not list(tmp_path.iterdir())  # nothing in the state dir: a name there can be taken first


def _symlinked(p: Path) -> None:
    p.rename(p.with_name("elsewhere"))
    p.symlink_to(p.with_name("elsewhere"))


def _fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


BAD_VIEWS: list[tuple[str, Callable[[Path, float], object]]] = [
    ("group-writable", lambda p, now: p.chmod(0o620)),
    ("another user's", lambda p, now: os.chown(p, 65534, -1)),
    ("a symlink to a good one", lambda p, now: _symlinked(p)),
    ("a FIFO", lambda p, now: _fifo(p)),
    ("no header line", lambda p, now: p.write_bytes(b"5 7 9")),
    ("a header that is not JSON", lambda p, now: p.write_bytes(b"{at: 1}\n5 7 9\n")),
    ("a header nested 5000 deep", lambda p, now: p.write_bytes(b"[" * 5000 + b"\n5 7 9\n")),
    ("a header too long", lambda p, now: p.write_bytes(json.dumps({"at": now, "slots": [], "x": "y" * 70000})
                                                       .encode() + b"\n5 7 9\n")),
    ("a time that is not a number", lambda p, now: p.write_bytes(b'{"at": true, "slots": []}\n5 7 9\n')),
    ("slots that are not a list", lambda p, now: p.write_bytes(b'{"at": %f, "slots": {}}\n5 7 9\n' % now)),
    ("not numbers after it", lambda p, now: p.write_bytes(b'{"at": %f, "slots": []}\n5 x7 9\n' % now)),
    ("larger than the limit", lambda p, now: os.truncate(p, lineview.MAX_VIEW + 1)),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("what,spoil", BAD_VIEWS, ids=[w for w, _ in BAD_VIEWS])
def test_a_view_that_is_not_this_users_own_well_formed_file_is_not_used(
        tmp_path: Path, what: str, spoil: Callable[[Path, float], object]) -> None:
    now = time.time()
    if what == "another user's" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    lineview.write(str(tmp_path), "shared", [5, 7, 9], SLOTS, now)
    assert lineview.read(str(tmp_path), "shared", 9, now) is not None  # good until spoilt
    spoil(Path(lineview.view_path(str(tmp_path), "shared")), now)
    assert lineview.read(str(tmp_path), "shared", 9, now) is None, what


def _plant(state_dir: Path, seq: int, place: int, label: str) -> None:
    """This user's view of the line, rewritten by hand: ticket `seq` at
    index `place`, the holder named `label`."""
    path = Path(lineview.view_path(str(state_dir), "shared"))
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    for s in header["slots"]:
        s["label"] = label
    live = [10**9 + i for i in range(place)] + [seq] + [2 * 10**9 + i for i in range(9)]
    lineview.write(str(state_dir), "shared", live, header["slots"], time.time())


@pytest.mark.timeout(90)
def test_far_back_a_report_uses_the_shared_view_and_near_the_head_works_the_line_out(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    ahead = [runs("--", "true", name=f"ahead{i}") for i in range(lineview.NEAR)]  # report once, at once
    wait_for(lambda: len(live_tickets(state_dir)) == lineview.NEAR, what="the line ahead")
    last = runs("--report-every", "0.2", "--", "true", name="last")
    view = Path(lineview.view_path(str(state_dir), "shared"))
    # Its first report: no view yet, so worked out afresh -- and shared.
    wait_for(lambda: f"({lineview.NEAR} ahead)" in last.err and view.exists(), what="a fresh report, shared")
    seq = list_tickets(pool_dir(str(state_dir), "shared"))[-1][0]
    # What is shared (and sent with every report) is what a status line
    # shows, not the whole holder record: every report of a long line
    # writes, reads and parses it.
    header = json.loads(view.read_bytes().split(b"\n", 1)[0])
    assert header["slots"][0]["label"] == "placeholder"
    assert set(header["slots"][0]) <= {"slot", "held", "error", "label", "user", "held_s", "budget", "phase",
                                       "lock_holders", "run_id", "pid", "orphan_pids", "orphan_user"}, header
    assert lineview.read(str(state_dir), "shared", seq, time.time())[:2] == (lineview.NEAR, lineview.NEAR + 1)  # type: ignore[index]

    # Far back by the view (20 ahead): its reports read the view.
    def far_report() -> bool:
        _plant(state_dir, seq, 20, "from-the-view")
        return any("(20 ahead)" in ln and "from-the-view" in ln for ln in last.err.splitlines())
    wait_for(far_report, timeout=20, what="a report from the view", interval=0.1)
    # Near the head by the view (3 ahead): never trusted there; afresh again.
    _plant(state_dir, seq, 3, "near-the-head-view")
    n = len(last.err.splitlines())
    wait_for(lambda: any(f"({lineview.NEAR} ahead)" in ln and "placeholder" in ln
                         for ln in last.err.splitlines()[n:]), timeout=20, what="a fresh report again")
    assert "(3 ahead)" not in last.err and "near-the-head-view" not in last.err
    gate.touch()
    assert holder.wait() == 0 and last.wait() == 0 and all(r.wait() == 0 for r in ahead)


@pytest.mark.timeout(10)
def test_a_view_carries_the_typical_run_and_a_malformed_one_is_left_out(tmp_path: Path) -> None:
    now = time.time()
    kinds = {"label:make check": [300.0, 4], "user:alice": [120.0, 6]}
    lineview.write(str(tmp_path), "shared", [5, 7, 9], SLOTS, now, (123.0, 7, now - 10, kinds))
    got = lineview.read(str(tmp_path), "shared", 9, now)
    assert got is not None and got[3] == (123.0, 7, now - 10, kinds)
    path = Path(lineview.view_path(str(tmp_path), "shared"))
    path.write_bytes(json.dumps({"at": now, "slots": SLOTS, "typical": [60.0, 7, now]}).encode() + b"\n5 7 9\n")
    assert lineview.read(str(tmp_path), "shared", 9, now)[3] == (60.0, 7, now, {})  # type: ignore[index]
    many = {f"label:{i}": [1.0, 3] for i in range(lineview.MAX_KINDS + 1)}
    for bad in ([0, 7, now], [-1.0, 7, now], [60.0, -1, now], [60.0, 7.5, now], [60.0, True, now], [60.0, 7],
                "60", [60.0, 7, "now"], [1e12, 7, now], [60.0, 7, now, []], [60.0, 7, now, {"cmd:x": [1.0, 3]}],
                [60.0, 7, now, {"label:x": [0, 3]}], [60.0, 7, now, {"label:x": [1.0, 0]}],
                [60.0, 7, now, {"label:x": [1.0]}], [60.0, 7, now, many]):
        path.write_bytes(json.dumps({"at": now, "slots": SLOTS, "typical": bad}).encode() + b"\n5 7 9\n")
        got = lineview.read(str(tmp_path), "shared", 9, now)
        assert got is not None and got[:2] == (2, 3) and got[3] is None, bad  # the view serves, its ETA basis not


@pytest.mark.timeout(20)
def test_far_back_a_report_takes_its_eta_basis_from_the_view_not_the_history(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run far back reads no history for its ETA while a run nearer the
    # head shares one it read: at N=300 those reads were half the CPU of
    # a line's first 30 s.
    from slotq import history, protocol
    from slotq.config import HostConfig
    from slotq.host.runner import HostRunner
    from slotq.spec import RunSpec

    def no_read(*a: object, **k: object) -> list[dict[str, object]]:
        raise AssertionError("the history was read")

    class FarBack:  # what survey reads of a waiter that finds itself in the view
        class ticket:
            seq = 4242
        slot_count = 1

    from slotq.host.hostqueue import ensure_state_dir

    ensure_state_dir(str(state_dir))
    now = time.time()
    lineview.write(str(state_dir), "shared", [*range(1, 21), 4242], SLOTS, now, (123.0, 7, now - 10, {}))
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    runner = HostRunner(RunSpec(["true"], budget=30, cwd=str(tmp_path)), state_dir=str(state_dir),
                        config=HostConfig(), in_fd=in_r, out_fd=out_w)
    try:
        monkeypatch.setattr(history, "recent", no_read)
        runner.line().report(FarBack(), "shared", 40.0, with_eta=True)  # type: ignore[arg-type]
        stream = protocol.MAGIC + os.read(out_r, 65536)
        events = [p for k, p in protocol.Decoder().feed(stream) if k == protocol.EVENT]
        queued = [e for e in events if isinstance(e, dict) and e.get("event") == "queued"]
        assert queued and queued[0]["ahead"] == 20, events
        assert "typical run 2m03s (median of the pool's last 7 run(s))" in str(queued[0]["eta_how"]), queued[0]
        # With no basis in the view, the run reads the history itself.
        lineview.write(str(state_dir), "shared", [*range(1, 21), 4242], SLOTS, time.time())
        runner.line().typical = None
        with pytest.raises(AssertionError, match="the history was read"):
            runner.line().report(FarBack(), "shared", 70.0, with_eta=True)  # type: ignore[arg-type]
    finally:
        runner.close_stream()
        for fd in (in_r, in_w, out_r):
            os.close(fd)



@pytest.mark.timeout(10)
def test_a_waiting_runs_eta_counts_a_run_with_two_history_lines_once(tmp_path: Path) -> None:
    # A Slurm run can have two lines (its node's, then the relay's word):
    # the typical run is the median of runs, not of lines. Counted twice,
    # one slow run made the typical run 55 s here instead of 10 s.
    from slotq import history
    from slotq.history import eta

    now = time.time()
    for run_id, ran in (("slow", 100.0), ("slow", 100.0), ("a", 10.0), ("b", 10.0)):
        history.append(str(tmp_path), {"run_id": run_id, "pool": "shared", "outcome": "passed", "ran_s": ran,
                                       "phases": {"ended": now}})
    typical, runs, _, _ = eta.basis(str(tmp_path), "shared", now, None, None)
    assert (typical, runs) == (10.0, 3)
