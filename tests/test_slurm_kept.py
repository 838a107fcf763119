"""Kept runs in Slurm (issue 46, DESIGN.md 1a): `run --slurm --attach-for`
and `--detach` leave a job in Slurm's line, in its place; `attach` comes
back to it; its lease, `cancel` and the death of the process that keeps
it end it as for a run of this machine -- against the private cluster
scripts/test starts, checked with what Slurm itself says (squeue)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import running_with, slotq_cmd, wait_for
from slotq.client.ledger import Ledger
from slurm_world import history_lines, jobs_named, placeholder, requires_cluster

pytestmark = requires_cluster


def slotq(tmp: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=tmp)


def result_of(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def detach(tmp: Path, *args: str) -> str:
    """`run --slurm --detach`: the run id, once the run has its place."""
    proc = slotq(tmp, "run", "--slurm", "--detach", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def job_of(run_id: str) -> str:
    """The run's job, pending or running ("" once Slurm has none)."""
    return jobs_named(f"slotq-{run_id}").strip()


def keepers(run_id: str) -> list[int]:
    """The pids of the process that keeps the run (`slotq host keep --slurm`, its fork)."""
    pids = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"host\0keep\0" in cmd and b"--slurm" in cmd and os.fsencode(str(os.environ["SLOTQ_LEDGER"])) in env:
            pids.append(int(name))
    return pids


@pytest.mark.timeout(90)
def test_attach_for_leaves_a_pending_job_in_its_place_and_attach_gets_its_result(slurm_env: Path) -> None:
    tmp = slurm_env
    placeholder(tmp, 8)
    began = time.monotonic()
    left = slotq(tmp, "run", "--slurm", "--attach-for", "2s", "--json", str(tmp / "left.json"), "--", "echo", "hello")
    took = time.monotonic() - began
    assert left.returncode == 75, left.stderr
    assert 2.0 <= took < 8.0
    rec = result_of(tmp / "left.json")
    run_id = rec["run_id"]
    assert rec["outcome"] == "detached" and rec["exit_code"] == 75
    last = left.stderr.strip().splitlines()[-1]
    assert f"slotq attach {run_id}" in last and "waiting at position 1" in last, last
    assert left.stdout == ""
    assert job_of(run_id).endswith("PENDING")  # its place: the job, still in Slurm's line
    back = slotq(tmp, "attach", run_id, "--for", "60s", "--json", str(tmp / "back.json"))
    assert back.returncode == 0, back.stderr
    assert back.stdout == "hello\n"
    res = result_of(tmp / "back.json")
    assert res["outcome"] == "passed" and res["run_id"] == run_id and res["waited_s"] >= 4, res
    assert "slotq: passed (exit 0)" in back.stderr.strip().splitlines()[-1]
    # Its time in Slurm's line is one queue wait in the ledger, closed at its slot.
    waits = [w for w in Ledger(str(tmp / "ledger.sqlite")).records(str(tmp)) if w.run_id == run_id]
    assert [w.kind for w in waits] == ["queue"] and waits[0].end is not None
    assert waits[0].end - waits[0].start >= 4
    wait_for(lambda: not keepers(run_id), timeout=10, what="the keeping process to end with the run")
    assert history_lines(run_id)[-1]["kept"] == 900.0  # marked kept in the history, with its lease


@pytest.mark.timeout(90)
def test_killing_an_attach_leaves_the_job_and_a_killed_keeper_takes_it_within_2s(slurm_env: Path) -> None:
    tmp = slurm_env
    placeholder(tmp, 30)
    run_id = detach(tmp, "--", "true")
    attach = subprocess.Popen(slotq_cmd() + ["attach", run_id], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd=tmp, start_new_session=True)
    wait_for(lambda: (tmp / "kept" / run_id / "attached").exists(), what="the attacher")
    os.killpg(attach.pid, signal.SIGKILL)  # as a harness ends a tool call
    attach.communicate(timeout=10)
    assert job_of(run_id).endswith("PENDING")
    [keeper] = keepers(run_id)
    t0 = time.monotonic()
    os.kill(keeper, signal.SIGKILL)  # the job's caller gone: the liveness rule
    wait_for(lambda: job_of(run_id) == "", timeout=5, what="the job cancelled")
    assert time.monotonic() - t0 <= 2.0
    wait_for(lambda: history_lines(run_id), timeout=10, what="the run's history line")
    assert history_lines(run_id)[-1]["outcome"] == "caller_gone"


@pytest.mark.timeout(90)
def test_a_lease_that_lapses_while_pending_cancels_the_job_as_caller_gone(slurm_env: Path) -> None:
    tmp = slurm_env
    placeholder(tmp, 30)
    run_id = detach(tmp, "--lease", "1s", "--", "true")
    wait_for(lambda: job_of(run_id) == "", timeout=15, what="the lapsed run's job cancelled")
    back = slotq(tmp, "attach", run_id, "--json", str(tmp / "r.json"))
    res = result_of(tmp / "r.json")
    assert back.returncode == 129 and res["outcome"] == "caller_gone", back.stderr
    assert "nobody attached within the 1.0s lease while pending" in res["message"], res["message"]


@pytest.mark.timeout(90)
def test_a_lease_that_lapses_while_running_ends_the_command_within_the_grace(slurm_env: Path) -> None:
    tmp = slurm_env
    marker = tmp / "started"
    run_id = detach(tmp, "--lease", "1s", "--kill-grace", "1s", "--", "sh", "-c", f"touch {marker}; exec sleep 60")
    wait_for(marker.exists, timeout=30, what="the command to start")
    wait_for(lambda: job_of(run_id) == "", timeout=20, what="the job to end")
    back = slotq(tmp, "attach", run_id, "--json", str(tmp / "r.json"))
    res = result_of(tmp / "r.json")
    assert back.returncode == 129 and res["outcome"] == "caller_gone", back.stderr
    assert "nobody attached within the 1.0s lease while the command ran: stopped" in res["message"], res
    ph = res["phases"]
    assert ph["ended"] - ph["started"] < 1 + 1 + 1 + 3  # the lease, its check, the grace, a busy machine


@pytest.mark.timeout(90)
def test_cancel_of_a_kept_slurm_run_cancels_its_job_without_naming_slurm(slurm_env: Path) -> None:
    tmp = slurm_env
    placeholder(tmp, 30)
    run_id = detach(tmp, "--", "true")
    job = job_of(run_id).split()[0]
    status = slotq(tmp, "status", "--slurm", "--json")
    [mine] = [j for v in json.loads(status.stdout)["partitions"] for j in v["pending"] if j["job_id"] == job]
    assert mine["kept"] == {"lease_s": 900.0}, mine  # its lease, kept by its process here
    assert "[kept: its caller may be away, lease 15m00s]" in slotq(tmp, "status", "--slurm").stdout
    done = slotq(tmp, "cancel", run_id)
    assert done.returncode == 0 and f"cancelled run {run_id} (Slurm job {job})" in done.stderr, done.stderr
    wait_for(lambda: job_of(run_id) == "", timeout=10, what="the job cancelled")
    back = slotq(tmp, "attach", run_id, "--json", str(tmp / "r.json"))
    assert back.returncode == 130 and result_of(tmp / "r.json")["outcome"] == "cancelled", back.stderr


@pytest.mark.timeout(90)
def test_the_mcp_server_keeps_a_slurm_run_across_calls(slurm_env: Path) -> None:
    pytest.importorskip("mcp", reason="the mcp extra")
    from test_mcp import drive, server, structured

    tmp = slurm_env
    placeholder(tmp, 6)

    async def body() -> None:
        async with server(tmp, "--slurm") as s:
            first = structured(await s.call_tool("run_command", {"command": ["echo", "hi"], "wait_for": 1}))
            assert first["outcome"] == "detached", first
            assert job_of(first["run_id"]).endswith("PENDING")
            back = structured(await s.call_tool("attach_run", {"run_id": first["run_id"], "wait_for": 60}))
            assert back["outcome"] == "passed" and back["output"]["text"] == "hi\n", back
        async with server(tmp) as s:  # a call says slurm itself
            done = structured(await s.call_tool("run_command", {"command": ["echo", "there"], "slurm": True,
                                                                "wait_for": 60}))
            assert done["outcome"] == "passed" and done["output"]["text"] == "there\n", done
            line = wait_for(lambda: history_lines(str(done["run_id"])), timeout=10, what="its history line")
            assert str(line[-1]["slot"]).startswith("slurm job "), line  # it ran as a Slurm job
    drive(body)


@pytest.mark.timeout(90)
def test_the_python_api_submits_a_slurm_run_and_attaches_to_it(slurm_env: Path) -> None:
    import slotq

    kept = slotq.submit(slotq.RunSpec(["echo", "api"], cwd=str(slurm_env)), slurm=True)
    assert job_of(kept.run_id) != "" or history_lines(kept.run_id), "a job, or a run already over"
    result = kept.attach(timeout=60, stdout_fd=-1, stderr_fd=-1)
    assert result.outcome.value == "passed" and result.run_id == kept.run_id, result.message
