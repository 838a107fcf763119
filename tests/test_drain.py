"""Drain and resume (host/drain.py, cli/hostdrain.py): the pool's owner
stops a pool starting commands; running ones finish under their budgets,
waiting ones keep their places and say why they wait, new ones join the
line; `resume` starts them in line order. Only root or the state dir's
owner drains: a member's file under the name is no drain."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Start, line_up, live_tickets, slotq_cmd, start_holder, status_json, wait_for
from remote_host import Remote
from shared_world import SKIP_WHY, USERS, World, world  # noqa: F401 (world: a fixture)

pytestmark = pytest.mark.timeout(90)


def host(*args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`slotq host ARGS`, as root, on the test's state dir (or `state`)."""
    env = dict(os.environ, **({"SLOTQ_STATE_DIR": str(state)} if state is not None else {}))
    return subprocess.run(slotq_cmd() + ["host", *args], capture_output=True, text=True, timeout=20,
                          stdin=subprocess.DEVNULL, env=env)


def nothing_starts(log: Path, seconds: float = 1.0) -> None:
    """Watch `log` for `seconds` (several of a drained head's looks): no
    command writes to it."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert not log.exists() or not log.read_text(), f"a command started in a drained pool: {log.read_text()}"
        time.sleep(0.05)  # sleep-ok: an observation window (that nothing happens), not a wait for something


def drained_line(err: str, by: str = "root") -> bool:
    return f"pool shared drained by {by} since " in err and ": disk swap" in err


def test_drain_and_resume_say_what_is_wrong_in_one_line(state_dir: Path) -> None:
    assert host("drain").returncode == 64
    bad = host("drain", "nope", "--reason", "x")
    assert bad.returncode == 64 and bad.stderr.count("\n") == 1 and "unknown pool 'nope'" in bad.stderr
    no_reason = host("drain", "shared")
    assert no_reason.returncode == 64 and "--reason" in no_reason.stderr
    assert host("resume", "--bogus").returncode == 64
    done = host("resume", "shared")
    assert done.returncode == 0 and done.stdout == "pool shared was not drained\n"


def test_a_drained_one_slot_pool_finishes_the_running_keeps_the_line_and_resumes_it_in_order(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate, log = tmp_path / "gate", tmp_path / "log"
    holder = start_holder(runs, state_dir, gate)
    waiters = line_up(runs, state_dir, [f"echo w{i} >> {log}" for i in range(2)], "--report-every", "0.2s")
    done = host("drain", "--reason", "disk swap")
    assert done.returncode == 0, done.stderr
    assert "drained pool shared: no new command starts; 1 running finish under their budgets, 2 waiting keep " \
           "their places" in done.stdout
    gate.touch()
    assert holder.wait() == 0 and holder.result()["outcome"] == "passed"  # the running one finished
    late = runs("--report-every", "0.2s", "--", "sh", "-c", f"echo late >> {log}", name="late")  # joins the line
    wait_for(lambda: len(live_tickets(state_dir)) == 3, what="the late run in line")
    nothing_starts(log)
    for w in [*waiters, late]:
        wait_for(lambda: drained_line(w.err), what="the waiting lines say the pool is drained, by whom and why")
    pool = next(p for p in status_json()["pools"] if p["pool"] == "shared")
    assert pool["drained"]["by"] == "root" and pool["drained"]["reason"] == "disk swap"
    assert not pool["slots"][0]["held"] and len(pool["waiting"]) == 3
    text = subprocess.run(slotq_cmd() + ["status"], capture_output=True, text=True, timeout=20).stdout
    assert "drained by root since" in text and "a new run would wait until the pool is resumed" in text
    resumed = host("resume")
    assert resumed.returncode == 0 and "resumed pool shared: 3 waiting take the slots in line order" in resumed.stdout
    for w in [*waiters, late]:
        assert w.wait() == 0, w.err
    assert log.read_text().split() == ["w0", "w1", "late"]
    assert status_json()["pools"][0]["drained"] is None


def test_a_drain_longer_than_the_claim_window_passes_no_head_over_and_keeps_the_order(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # Heads that leave a free slot alone are passed over after the claim
    # window (host/claim.py) -- unless the pool is drained: then they wait
    # as they should, and the resume starts them in their order.
    from slotq.host.claim import CLAIM_WINDOW, OWNER_GRACE

    gate, log = tmp_path / "gate", tmp_path / "log"
    holder = start_holder(runs, state_dir, gate)
    waiters = line_up(runs, state_dir, [f"echo w{i} >> {log}" for i in range(4)], "-q")
    assert host("drain", "--reason", "disk swap").returncode == 0
    gate.touch()
    assert holder.wait() == 0
    nothing_starts(log, CLAIM_WINDOW + OWNER_GRACE + 3.0)
    assert host("resume").returncode == 0
    for w in waiters:
        assert w.wait() == 0, w.err
    assert log.read_text().split() == ["w0", "w1", "w2", "w3"]


def test_in_a_drained_pool_with_a_free_slot_no_run_starts_and_max_wait_counts_the_drain(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two slots (the runner's own wait, not a keeper's) and a free one: a
    # run would start at once (launch.start_now); drained, it waits.
    config = tmp_path / "host.toml"
    config.write_text("[pools]\nshared = 2\nlanding = 1\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(config))
    log = tmp_path / "log"
    assert host("drain", "shared", "--reason", "disk swap").returncode == 0
    waiting = runs("--", "sh", "-c", f"echo waited >> {log}", name="waiting")
    wait_for(lambda: drained_line(waiting.err), what="the run waits, and says why")
    gave_up = subprocess.run(slotq_cmd() + ["run", "--max-wait", "1s", "--", "true"], capture_output=True,
                             text=True, timeout=30, cwd=tmp_path)
    assert gave_up.returncode == 117, gave_up.stderr  # not admitted: the infrastructure's, never the work's
    assert "not_admitted" in gave_up.stderr and "drained" in gave_up.stderr
    landing = subprocess.run(slotq_cmd() + ["run", "--class", "landing", "--", "true"], capture_output=True,
                             text=True, timeout=30, cwd=tmp_path)
    assert landing.returncode == 0, "another pool is not drained"
    nothing_starts(log)
    assert host("resume", "shared").returncode == 0
    assert waiting.wait() == 0 and log.read_text() == "waited\n"
    assert waiting.result()["waited_s"] >= 1.0  # its wait is recorded as a wait


def test_a_kept_run_waits_out_a_drain_and_runs_at_the_resume(state_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert host("drain", "--reason", "disk swap").returncode == 0
    started = subprocess.run(slotq_cmd() + ["run", "--detach", "--", "sh", "-c", f"echo kept >> {log}"],
                             capture_output=True, text=True, timeout=30, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the kept run in line")
    nothing_starts(log)
    assert host("resume").returncode == 0
    back = subprocess.run(slotq_cmd() + ["attach", run_id], capture_output=True, text=True, timeout=30)
    assert back.returncode == 0, back.stderr
    assert log.read_text() == "kept\n"


@pytest.mark.timeout(120)
def test_a_drained_remote_host_keeps_an_ssh_run_waiting_until_its_owner_resumes_it(
        remote: Remote, runs: Start, tmp_path: Path) -> None:
    drained = remote.ssh(f"{remote.remote_slotq} host drain --reason 'disk swap'; echo rc=$?")
    assert drained.strip().endswith("rc=0"), drained
    owner = remote.ssh("id -un").strip()
    waiting = runs(*remote.args, "--report-every", "0.2s", "--", "true", name="remote")
    wait_for(lambda: drained_line(waiting.err, owner), timeout=30, what="the ssh run waits, and says why")
    assert remote.shared()["drained"]["reason"] == "disk swap"
    assert waiting.proc.poll() is None
    remote.ssh(f"{remote.remote_slotq} host resume")
    assert waiting.wait(timeout=60) == 0, waiting.err


@pytest.mark.skipif(os.getuid() != 0 or len(USERS) < 2, reason=SKIP_WHY)
def test_only_the_owner_drains_and_a_members_file_under_the_name_is_no_drain(world: World) -> None:
    a, b = world.a, world.b
    refused = world.run(a, "host", "drain", "--reason", "mine now")
    assert refused.returncode == 77 and refused.stderr.count("\n") == 1, refused.stderr
    assert "only root or the state directory's owner (root) may do this; you are " + a in refused.stderr
    assert world.run(a, "host", "resume").returncode == 77
    # A member's own file under the name: no drain, for anyone.
    planted = world.py(a, "import json,os,sys,time\n"
                          f"open(os.path.join({str(world.state)!r}, 'drain.shared'), 'w')"
                          ".write(json.dumps({'since': time.time(), 'reason': 'gotcha'}))")
    assert planted.returncode == 0, planted.stderr
    quick = world.run(b, "run", "--", "true")
    assert quick.returncode == 0, quick.stderr
    assert next(p for p in status_json_as(world, b)["pools"] if p["pool"] == "shared")["drained"] is None
    # The owner's drain replaces it; the member can neither remove nor change it.
    assert host("drain", "shared", "--reason", "disk swap", state=world.state).returncode == 0
    assert os.stat(world.state / "drain.shared").st_uid == 0
    gone = world.py(a, f"import os; os.unlink({str(world.state / 'drain.shared')!r})")
    assert gone.returncode != 0 and "PermissionError" in gone.stderr
    err = world.root / "b.err"
    with open(err, "wb") as f:
        p = world.popen(b, "run", "--report-every", "0.2s", "--", "true", stderr=f.fileno())
    try:
        wait_for(lambda: drained_line(err.read_text()), what="B's run waits in the drained pool, and says why")
        assert p.poll() is None
        assert host("resume", "shared", state=world.state).returncode == 0
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()


def status_json_as(world: World, user: str) -> dict[str, Any]:
    done = world.run(user, "status", "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))
