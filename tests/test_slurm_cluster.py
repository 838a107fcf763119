"""The Slurm cluster the Slurm tests run against (scripts/slurm-test-cluster,
started by scripts/test): real munged + slurmctld + slurmd on loopback. These
tests check the harness itself -- that it schedules, queues with a reason,
serves an ordinary user and listens on 127.0.0.1 only."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from conftest import wait_for

CONF = os.environ.get("SLOTQ_TEST_SLURM_CONF", "")
pytestmark = pytest.mark.skipif(not CONF or not Path(CONF).exists(),
                                reason="no test Slurm cluster (scripts/test starts one as root)")


def slurm(*args: str, user: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    pw = pwd.getpwnam(user) if user else None
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, SLURM_CONF=CONF), cwd="/",
                          user=pw.pw_uid if pw else None, group=pw.pw_gid if pw else None,
                          extra_groups=[] if pw else None)


@pytest.mark.timeout(60)
def test_the_cluster_runs_a_job_and_queues_the_next_with_a_reason() -> None:
    one = slurm("sbatch", "--parsable", "-p", "test", "-c2", "-o", "/dev/null", "--wrap", "sleep 30")
    two = slurm("sbatch", "--parsable", "-p", "test", "-c2", "-o", "/dev/null", "--wrap", "true")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    j1, j2 = one.stdout.strip(), two.stdout.strip()
    try:
        def states() -> str:
            return slurm("squeue", "-h", "-j", f"{j1},{j2}", "-o", "%i %T %r").stdout

        wait_for(lambda: f"{j1} RUNNING" in states(), timeout=20, what="the first job running")
        # Waiting for the CPUs the first holds, the second is pending with a
        # reason (Resources, or Priority until the scheduler looks at it
        # again). Right after the submit the reason can still be None, for
        # longer on a busy machine: wait for it.
        def pending_with_reason() -> str | None:
            text = states()
            return text if any(f"{j2} PENDING {why}" in text for why in ("Resources", "Priority")) else None

        text = wait_for(pending_with_reason, timeout=20, interval=0.1,
                        what="the second job pending with a reason")
        assert f"{j1} RUNNING" in text, text
    finally:
        slurm("scancel", j1, j2)
    wait_for(lambda: slurm("squeue", "-h", "-j", f"{j1},{j2}", "-t", "PD,R,CG", "-o", "%i").stdout.strip() == "",
             timeout=30, what="both jobs gone")


@pytest.mark.timeout(60)
def test_an_ordinary_user_can_run_on_both_partitions() -> None:
    users = [u for u in os.environ.get("SLOTQ_TEST_USERS", "").split(",") if u]
    if not users:
        pytest.skip("no test users (scripts/test-users)")
    for part in ("test", "landing"):
        proc = slurm("srun", "-p", part, "-n1", "id", "-un", user=users[0])
        assert proc.returncode == 0 and proc.stdout.strip() == users[0], proc.stderr


def _listeners() -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket, from the kernel
    (/proc/net/tcp and tcp6: no `ss`, which a minimal Debian lacks)."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            addr, port = fields[1].split(":")
            if name == "tcp":
                ip = ".".join(str(b) for b in reversed(bytes.fromhex(addr)))
            else:
                ip = "::" if int(addr, 16) == 0 else addr
            out.append((ip, int(port, 16)))
    return out


def test_the_daemons_listen_on_loopback_only() -> None:
    conf = Path(CONF).read_text()
    ports = [int(line.split("=", 1)[1]) for line in conf.splitlines()
             if line.startswith(("SlurmctldPort", "SlurmdPort"))]
    listening = _listeners()
    for port in ports:
        addrs = [ip for ip, p in listening if p == port]
        assert addrs and all(a == "127.0.0.1" for a in addrs), (port, addrs)


# ---------------------------------------------------------------- the backend's pieces

def _job_state(job: str) -> str:
    out = slurm("squeue", "-h", "-j", job, "-t", "all", "-o", "%T").stdout.strip()
    return out or "GONE"


def _occupy() -> str:
    """A job holding both CPUs of the node, so that the next one pends."""
    proc = slurm("sbatch", "--parsable", "-p", "test", "-c2", "-o", "/dev/null", "--wrap", "sleep 120")
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    wait_for(lambda: _job_state(job) == "RUNNING", timeout=20, what="the occupying job running")
    return job


@pytest.mark.timeout(60)
@pytest.mark.parametrize("style", ["pid", "group"])
def test_a_sigkilled_caller_gets_its_pending_job_cancelled_within_2s(style: str) -> None:
    import signal
    import sys
    import time

    blocker = _occupy()
    caller = subprocess.Popen([sys.executable, str(Path(__file__).with_name("slurm_caller.py")), "test"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
                              env=dict(os.environ, SLURM_CONF=CONF))
    try:
        assert caller.stdout is not None
        job = caller.stdout.readline().strip()
        assert job.isdigit()
        wait_for(lambda: _job_state(job) == "PENDING", timeout=20, what="our job pending")
        t0 = time.monotonic()
        if style == "pid":
            os.kill(caller.pid, signal.SIGKILL)
        else:
            os.killpg(caller.pid, signal.SIGKILL)
        caller.wait()
        wait_for(lambda: _job_state(job) in ("CANCELLED", "GONE"), timeout=5, what="the job cancelled")
        assert time.monotonic() - t0 < 2.0 + 1.0  # the promise is 2 s; a second's slack for squeue itself
    finally:
        slurm("scancel", blocker)
        if caller.poll() is None:
            caller.kill()


@pytest.mark.timeout(60)
def test_a_caller_that_says_done_leaves_its_job_alone() -> None:
    import sys

    caller = subprocess.Popen([sys.executable, str(Path(__file__).with_name("slurm_caller.py")), "test"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, SLURM_CONF=CONF))
    assert caller.stdout is not None and caller.stdin is not None
    job = caller.stdout.readline().strip()
    caller.stdin.write("done\n")
    caller.stdin.close()
    assert caller.wait(timeout=20) == 0
    wait_for(lambda: _job_state(job) in ("COMPLETED", "GONE"), timeout=30, what="the job completed")
    assert _job_state(job) != "CANCELLED"


def test_a_job_slurm_refuses_is_one_line_naming_slurms_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from slotq.errors import HostUnavailable
    from slotq.transports.slurm.ctl import submit

    monkeypatch.setenv("SLURM_CONF", CONF)
    with pytest.raises(HostUnavailable, match="Slurm refused the job: .*[Pp]artition"):
        submit(["-p", "no-such-partition"], "true")


@pytest.mark.timeout(60)
def test_the_pending_view_gives_position_reason_and_holders(monkeypatch: pytest.MonkeyPatch) -> None:
    from slotq.transports.slurm.ctl import pending_view, submit

    monkeypatch.setenv("SLURM_CONF", CONF)
    blocker = _occupy()
    jobs = []
    try:
        for _ in range(2):
            jobs.append(submit(["-p", "test", "-c2", "-o", "/dev/null", "-J", "slotq|view test"], "true"))
        wait_for(lambda: all(_job_state(j) == "PENDING" for j in jobs), what="both pending")
        # Slurm says why once its scheduler has looked at them (until then: None).
        wait_for(lambda: all(pending_view(j, "test")["reason"] in ("Priority", "Resources") for j in jobs),
                 timeout=20, what="Slurm's pending reasons")
        view = pending_view(jobs[1], "test")
        assert view["position"] == 2 and view["pending"] == 2, view
        assert view["reason"] in ("Priority", "Resources"), view
        holders = view["holders"]
        assert isinstance(holders, list) and [h["job_id"] for h in holders] == [blocker]
        assert holders[0]["user"] == pwd.getpwuid(os.getuid()).pw_name
        assert pending_view(jobs[0], "test")["position"] == 1
    finally:
        slurm("scancel", blocker, *jobs)
