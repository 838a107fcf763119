"""`slotq cancel` and admission (issue 1): a queued or running run
cancelled by id, label or owner, never another user's; the host's caps on
waiting runs and `--max-wait` end a run `not_admitted` at once, never as a
timeout; a run started inside a run that holds its pool's slot is refused
rather than left waiting for itself."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import (Start, group_alive, holder_record, live_tickets, reachable, second_user_slotq,
                      slot_held_here, slot_holder, slotq_cmd, start_holder, status_json, wait_for)
from slotq.client.ledger import Ledger


@pytest.mark.timeout(30)
def test_cancel_a_queued_and_a_running_run(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    pidf = tmp_path / "pgid"
    holder = runs("--label", "holder", "--kill-grace", "1", "--", "sh", "-c", f"echo $$ > {pidf}; sleep 300")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), what="holder running")
    holder_record(state_dir)
    alpha = runs("--label", "alpha", "--", "true", name="alpha")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="alpha in line")
    beta = runs("--label", "beta-1", "--", "true", name="beta")
    wait_for(lambda: len(live_tickets(state_dir)) == 2, what="beta in line")
    text = subprocess.run(slotq_cmd() + ["status"], capture_output=True, text=True, timeout=20).stdout
    alpha_id = next(w for p in status_json()["pools"] for w in p["waiting"] if w["label"] == "alpha")["run_id"]
    assert f"run {alpha_id}" in text  # plain status shows run ids
    me = pwd.getpwuid(os.getuid()).pw_name
    holder_id = slot_holder(state_dir)["run_id"]  # type: ignore[index]
    wait_for(lambda: reachable(holder_id), what="the running holder to listen for cancel")
    # Who cancelled, and in which phase (as a stop signal's cancel says it).
    queued, running = "while it waited for a slot; nothing ran", "while the command ran: stopped"
    for how, run, phase in ((["cancel", alpha_id], alpha, queued), (["cancel", "--label", "beta-*"], beta, queued),
                            (["cancel", "--mine"], holder, running)):
        proc = subprocess.run(slotq_cmd() + how, capture_output=True, text=True, timeout=20)
        assert proc.returncode == 0, proc.stderr
        assert run.wait() == 130
        res = run.result()
        assert res["outcome"] == "cancelled" and res["blame"] == "caller"
        assert re.fullmatch(rf"cancelled by slotq cancel \(pid \d+, user {me}\) {phase}", res["message"]), \
            res["message"]
    assert not group_alive(int(pidf.read_text()))
    proc = subprocess.run(slotq_cmd() + ["cancel", "nosuchrun1"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 66 and len(proc.stderr.strip().splitlines()) == 1
    # Nothing to do is not a failure (a cleanup script under `set -e`), as scancel.
    proc = subprocess.run(slotq_cmd() + ["cancel", "--mine"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0 and proc.stderr == "slotq cancel: nothing to cancel: no live run matches --mine\n"
    proc = subprocess.run(slotq_cmd() + ["cancel", alpha_id], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == f"slotq cancel: run {alpha_id} has already ended (cancelled): nothing to cancel\n"


@pytest.mark.timeout(40)
def test_cancel_by_a_label_that_is_not_utf8_finds_the_run(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    """A label typed with a byte that is not UTF-8 is kept as valid text
    (`\\xNN`); `slotq cancel --label` with the same bytes must find it."""
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    label = "job-\udcff"  # the byte 0xff, as Python passes it on to argv
    queued = runs("--label", label, "--", "true", name="queued")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the labelled run in line")
    proc = subprocess.run(slotq_cmd() + ["cancel", "--label", label], capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert queued.wait() == 130 and queued.result()["outcome"] == "cancelled"
    gate.touch()
    assert holder.wait() == 0


@pytest.mark.timeout(60)
def test_cancel_of_a_run_that_just_started_waits_for_it_to_listen(state_dir: Path, runs: Start) -> None:
    """A script cancels the run it has just started: the queue shows the run,
    but its runner opens its control socket only once the command has run
    0.1 s. `slotq cancel` waits for it, rather than saying "no live run"
    (exit 66) about a run `slotq status` shows running."""
    for attempt in range(5):
        run = runs("--", "sleep", "300", name=f"run{attempt}")
        rec = wait_for(lambda: slot_holder(state_dir), what="the run's holder record")
        runner = int(rec["pid"])
        os.kill(runner, signal.SIGSTOP)  # the runner as the scheduler may leave it: not yet listening
        if not reachable(str(rec["run_id"])):
            break
        os.kill(runner, signal.SIGCONT)  # too late to catch it before it listened: again
        assert subprocess.run(slotq_cmd() + ["cancel", str(rec["run_id"])], capture_output=True,
                              timeout=20).returncode == 0 and run.wait() == 130
    else:
        pytest.fail("never caught a run before it listened for cancel")
    try:
        cancel = subprocess.Popen(slotq_cmd() + ["cancel", str(rec["run_id"])], stderr=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            cancel.wait(timeout=0.5)  # it does not give up on a live run that does not listen yet
    finally:
        os.kill(runner, signal.SIGCONT)
    _, err = cancel.communicate(timeout=20)
    assert cancel.returncode == 0, err
    assert err.strip() == f"slotq cancel: cancelled run {rec['run_id']}"
    assert run.wait() == 130 and run.result()["outcome"] == "cancelled"


@pytest.mark.timeout(30)
def test_cancel_of_another_users_run_is_refused(shared_state: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, shared_state, gate)
    run_id = slot_holder(shared_state)["run_id"]  # type: ignore[index]
    wait_for(lambda: reachable(run_id), what="the run to listen for cancel")
    proc = subprocess.run(["runuser", "-u", "slotqtest", "--", *second_user_slotq(), "cancel", run_id],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 77, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"run {run_id} belongs to user root" in lines[0]
    assert holder.proc.poll() is None
    gate.touch()
    assert holder.wait() == 0


@pytest.mark.timeout(30)
def test_max_wait_0_runs_on_a_free_slot_and_is_not_admitted_at_once_on_a_busy_one(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # flock -n's "try": `--max-wait 0` was refused (must be more than zero).
    assert runs("--max-wait", "0", "--", "true", name="free").wait() == 0
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    t0 = time.monotonic()
    r = runs("--max-wait", "0", "--", "touch", str(tmp_path / "ran"), name="busy")
    assert r.wait() == 117
    assert time.monotonic() - t0 < 5  # at once: nothing waits for the holder
    res = r.result()
    assert res["outcome"] == "not_admitted" and not (tmp_path / "ran").exists()
    assert res["message"] == "not admitted: every slot of pool shared is busy, and --max-wait 0 means no waiting"
    gate.touch()


@pytest.mark.timeout(30)
def test_max_wait_ends_not_admitted_and_records_the_wait(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    r = runs("--max-wait", "2s", "--", "true", name="impatient")
    assert r.wait() == 117
    res = r.result()
    assert res["outcome"] == "not_admitted" and res["blame"] == "infrastructure"
    assert "--max-wait 2.0s" in res["message"] and "0 still ahead" in res["message"]
    assert 2.0 <= res["waited_s"] < 6
    ledger = Ledger(os.environ["SLOTQ_LEDGER"])
    credit = ledger.credit(str(tmp_path), 0, time.time() + 1)
    [wait] = credit.waits
    assert wait.record.run_id == res["run_id"] and wait.record.kind == "queue" and wait.closed_by == "end"
    assert wait.seconds >= 2.0
    gate.touch()


@pytest.mark.timeout(30)
def test_a_host_cap_on_waiting_runs_refuses_the_next_at_once(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text("[admission]\nmax_waiting = 2\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(cfg))
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    waiters = [runs("--", "true", name=f"w{i}") for i in range(2)]
    wait_for(lambda: len(live_tickets(state_dir)) == 2, what="two waiting")
    t0 = time.monotonic()
    third = runs("--", "true", name="third")
    assert third.wait() == 117
    assert time.monotonic() - t0 < 5
    res = third.result()
    assert res["outcome"] == "not_admitted"
    assert "max_waiting = 2" in res["message"] and "already has 2 run(s) waiting" in res["message"]
    gate.touch()
    assert [w.wait() for w in waiters] == [0, 0]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("policy", ["max_waiting", "max_waiting_per_user"])
def test_a_cap_of_zero_lets_no_run_wait_but_runs_one_that_need_not(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    """`max_waiting = 0` turned every run away, even with the slot free and
    nobody in line: the pool could not be used at all."""
    cfg = tmp_path / "host.toml"
    cfg.write_text(f"[admission]\n{policy} = 0\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(cfg))
    free = runs("--", "true", name="free")
    assert free.wait() == 0, free.err
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    busy = runs("--", "true", name="busy")
    assert busy.wait() == 117
    res = busy.result()
    assert res["outcome"] == "not_admitted" and "would have to wait in pool shared" in res["message"], res["message"]
    assert f"{policy} = 0" in res["message"]
    gate.touch()
    assert holder.wait() == 0


@pytest.mark.timeout(40)
def test_a_per_user_cap_counts_only_that_users_waiting_runs(
        shared_state: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text("[admission]\nmax_waiting_per_user = 1\n")
    gate = tmp_path / "gate"
    start_holder(runs, shared_state, gate)
    # Another user waits first (their own slotq; their own ledger).
    work = Path(tempfile.mkdtemp(prefix="slotq-peruser-", dir=shared_state.parent))
    os.chmod(work, 0o777)
    env = dict(os.environ, SLOTQ_LEDGER=str(work / "their-ledger.sqlite"))
    theirs = subprocess.Popen(["runuser", "-u", "slotqtest", "--", *second_user_slotq(), "run", "-q", "--", "true"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=work, env=env)
    try:
        wait_for(lambda: len(live_tickets(shared_state)) == 1, what="the other user's run waiting")
        monkeypatch.setenv("SLOTQ_CONFIG", str(cfg))
        mine = runs("--", "true", name="mine")  # their waiting run is not ours: admitted
        wait_for(lambda: len(live_tickets(shared_state)) == 2, what="our run waiting too")
        second = runs("--", "true", name="second")
        assert second.wait() == 117
        res = second.result()
        assert res["outcome"] == "not_admitted"
        assert "you already have 1 run(s) waiting" in res["message"] and "max_waiting_per_user = 1" in res["message"]
    finally:
        gate.touch()
        assert theirs.wait(timeout=20) == 0
    assert mine.wait() == 0


@pytest.mark.timeout(60)
def test_a_run_started_inside_a_run_that_holds_its_pools_slot_is_refused_at_once(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Without the refusal the inner run waits for the slot its own outer
    # run holds, until the outer's budget ends both: a make target that
    # calls `slotq run`, run itself through `slotq run`.
    inner = tmp_path / "inner.json"
    for how, args in (("at once", []), ("after waiting in line", ["--report-every", "0.2"])):
        gate = tmp_path / f"gate-{len(how)}"
        holder = start_holder(runs, state_dir, gate) if args else None
        outer = runs(*args, "--", *slotq_cmd(), "run", "--json", str(inner), "--", "echo", "inner ran",
                     name=f"outer-{len(how)}")
        if holder is not None:
            wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the outer run waiting")
            gate.touch()
            assert holder.wait() == 0
        assert outer.wait(timeout=30) == 117, how  # the inner run's exit code, through the outer command
        res, out = json.loads(inner.read_text()), outer.result()
        assert res["outcome"] == "not_admitted" and res["exit_code"] == 117, how
        assert f"inside run {out['run_id']}" in res["message"] and "holds slot shared#0" in res["message"], how
        assert out["outcome"] == "failed" and b"inner ran" not in outer.out, how
        assert not live_tickets(state_dir), how  # the inner run's early ticket went with it


@pytest.mark.timeout(60)
def test_a_nested_run_is_refused_before_its_outer_runs_holder_record_is_written(state_dir: Path) -> None:
    # The keeper writes the holder record just after it starts the command:
    # a command that runs slotq at once could look first, find the last
    # holder's record, and wait for the slot its own run holds until that
    # run's budget ended (seen once in the suite: the test above timed out
    # after 30 s). Here this test process holds the slot, as a keeper does,
    # under an earlier run's record, and its child carries the marker of
    # the run it is inside.
    with slot_held_here(state_dir) as lease:
        lease.record(run_id="0123456789ab", label="the last holder", phase="running")
        proc = subprocess.run(slotq_cmd() + ["run", "--max-wait", "5", "--", "echo", "ran"], capture_output=True,
                              text=True, timeout=30, env=dict(os.environ, SLOTQ_RUN_ID="ba9876543210"))
    assert proc.returncode == 117, proc.stderr
    assert ("this command runs inside run ba9876543210 (its command just started), which holds slot shared#0"
            in proc.stderr), proc.stderr
    assert proc.stdout == ""


@pytest.mark.timeout(60)
def test_a_run_inside_a_run_of_another_class_queues_for_its_own_pool(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    outer = runs("--class", "landing", "--", *slotq_cmd(), "run", "--", "echo", "inner ran", name="outer")
    assert outer.wait(timeout=30) == 0
    assert b"inner ran" in outer.out


@pytest.mark.timeout(60)
def test_a_process_that_only_carries_a_runs_marker_waits_its_turn(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Outside the run's process tree (e.g. a process that outlived an earlier
    # run, with its environment): the run's slot will come free.
    from conftest import Run

    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)
    holder_id = (slot_holder(state_dir) or {})["run_id"]
    stray = Run(["--", "echo", "stray ran"], tmp_path, "stray", env=dict(os.environ, SLOTQ_RUN_ID=holder_id))
    try:
        # Its first report, sent once its runner has looked and queued (its
        # ticket alone is taken before the runner looks).
        wait_for(lambda: "slotq: waiting" in stray.err or stray.proc.poll() is not None,
                 what="the run with the marker waiting in line")
        assert stray.proc.poll() is None, stray.err
        gate.touch()
        assert stray.wait() == 0 and holder.wait() == 0
        assert stray.out == b"stray ran\n"
    finally:
        stray.kill()
