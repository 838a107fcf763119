"""`slotq cancel --slurm` against the private Slurm cluster: by run id, by
label (the job's comment), --mine, $SLOTQ_BACKEND=slurm, and another
user's run. Split from test_slurm_e2e.py; the same world (slurm_world.py)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import one_line, slotq_cmd, wait_for
from slurm_world import CONF, err, jobs_named, pending_job, pending_run, requires_cluster, result, squeue, start

pytestmark = requires_cluster



@pytest.mark.timeout(90)
def test_slotq_cancel_slurm_cancels_a_pending_and_a_running_run(slurm_env: Path) -> None:
    # `slotq cancel` saw only this host's queue: a Slurm run was "no live
    # run", and only scancel by the job's name could end it.
    tmp = slurm_env

    def cancel(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(slotq_cmd() + ["cancel", "--slurm", *args], capture_output=True, text=True,
                              timeout=30, cwd=tmp)

    waiting, job = pending_run(tmp, "waiting")
    run_id = squeue("-j", job, "-o", "%j").strip().removeprefix("slotq-")
    done = cancel(run_id)
    assert done.returncode == 0 and done.stderr == f"slotq cancel: cancelled run {run_id} (Slurm job {job})\n"
    assert waiting.wait(timeout=20) == 130
    res = result(tmp, "waiting")
    assert res["outcome"] == "cancelled" and res["phases"]["started"] is None and "pending" in res["message"], res
    gone = cancel(run_id)  # ended: nothing to do, exit 0 (as scancel)
    assert gone.returncode == 0 and "has already ended (cancelled): nothing to cancel" in gone.stderr, gone.stderr
    subprocess.run(["scancel", "--name", f"placeholder-{tmp.name}"], env=dict(os.environ, SLURM_CONF=CONF),
                   timeout=30, check=True)
    marker = tmp / "started"
    running = start(tmp, "running", "--kill-grace", "1", "--label", "pr-7|x: pytest -q", "--", "sh", "-c",
                    f"touch {marker}; sleep 300")
    wait_for(marker.exists, timeout=20, what="the command running")
    # By label (it was "Slurm does not keep slotq's labels"): the job's comment.
    none = cancel("--label", "pr-8*")
    assert none.returncode == 0 and "nothing to cancel: no live run matches --label 'pr-8*'" in one_line(none)
    done = cancel("--label", "pr-7|x:*")
    assert done.returncode == 0 and done.stderr.startswith("slotq cancel: cancelled run "), done.stderr
    assert running.wait(timeout=20) == 130, err(tmp, "running")
    res = result(tmp, "running")
    assert res["outcome"] == "cancelled" and res["phases"]["started"] is not None, res
    wait_for(lambda: jobs_named(f"slotq-{res['run_id']}") == "", timeout=10, what="the job gone")
    assert cancel("--mine").returncode == 0


@pytest.mark.timeout(60)
def test_slotq_backend_slurm_makes_status_and_cancel_look_at_slurm_too(slurm_env: Path) -> None:
    # $SLOTQ_BACKEND=slurm sent every `slotq run` to Slurm, but `status`
    # showed this host's empty queue and `cancel --mine` found "no live run".
    tmp = slurm_env
    waiting, job = pending_run(tmp, "waiting")
    env = dict(os.environ, SLOTQ_BACKEND="slurm")
    status = subprocess.run(slotq_cmd() + ["status", "--json"], capture_output=True, text=True, timeout=30, env=env)
    assert status.returncode == 0, status.stderr
    [view] = json.loads(status.stdout)["partitions"]
    assert job in [p["job_id"] for p in view["pending"]], view
    done = subprocess.run(slotq_cmd() + ["cancel", "--mine"], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0 and f"(Slurm job {job})" in done.stderr, done.stderr
    assert waiting.wait(timeout=20) == 130


@pytest.mark.timeout(60)
def test_slotq_cancel_slurm_refuses_another_users_run_but_root_may(slurm_env: Path) -> None:
    from shared_world import PY, make_root, users_code

    def as_user(user: str, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        pw = pwd.getpwnam(user)
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/", user=pw.pw_uid,
                              group=pw.pw_gid, env={"PATH": os.environ["PATH"], "SLURM_CONF": CONF, **env})

    run_id = uuid.uuid4().hex[:12]
    sub = as_user("slotqa", ["sbatch", "--parsable", "-o", "/dev/null", "-J", f"slotq-{run_id}", "--time=1",
                             "--wrap", "sleep 60"])  # as the job of a run of slotqa's
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    root = make_root()
    try:
        proc = as_user("slotqb", [PY, "-m", "slotq", "cancel", "--slurm", run_id],
                       PYTHONPATH=str(users_code()), HOME=str(root / "home-slotqb"))
        assert proc.returncode == 77, proc.stderr
        assert proc.stderr == (f"slotq cancel: error: run {run_id} (Slurm job {job}) belongs to user slotqa: "
                               "you can cancel only your own runs\n")
        assert squeue("-j", job, "-o", "%i").strip() == job  # untouched
    finally:
        shutil.rmtree(root)
    proc = subprocess.run(slotq_cmd() + ["cancel", "--slurm", run_id], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr  # root may, as scancel lets it
    wait_for(lambda: jobs_named(f"slotq-{run_id}") == "", timeout=10, what="the job gone")


@pytest.mark.timeout(60)
def test_a_label_of_a_thousand_wide_characters_runs_and_is_cancelled_by_label(slurm_env: Path) -> None:
    # The label went into the job's comment whole: past Slurm's 1024 bytes
    # it refused the job ("Pathname ... too long"), blamed on the request.
    tmp = slurm_env
    label = "ä|\n" * 333
    proc = start(tmp, "wide", "--label", label, "--", "true")
    assert proc.wait(timeout=30) == 0, err(tmp, "wide")
    assert result(tmp, "wide")["label"] == label
    caller, job = pending_run(tmp, "waiting")  # and its label is still the way to cancel it
    assert squeue("-j", job, "-o", "%k").strip().endswith(": true")  # the default label: user: command
    long_one = start(tmp, "long", "--label", "ä" * 999, "--", "true")
    job2 = pending_job(tmp, "long")
    assert len(squeue("-j", job2, "-o", "%k").strip().encode()) <= 1024
    done = subprocess.run(slotq_cmd() + ["cancel", "--slurm", "--label", "ää*"], capture_output=True, text=True,
                          timeout=30, cwd=tmp)
    assert done.returncode == 0 and f"(Slurm job {job2})" in done.stderr, done.stderr
    assert long_one.wait(timeout=20) == 130
    caller.send_signal(signal.SIGINT)
    assert caller.wait(timeout=20) == 130


@pytest.mark.timeout(90)
def test_a_held_job_of_another_user_named_after_my_run_does_not_stop_my_cancel(slurm_env: Path) -> None:
    # Issue 65, row 17: B submits a held job named `slotq-<A's run id>`. A's
    # `cancel --slurm ID` said "belongs to user B" (77), and --mine found
    # nothing: the last squeue row for a run id won.
    from shared_world import PY, make_root, users_code

    def as_user(user: str, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        pw = pwd.getpwnam(user)
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/", user=pw.pw_uid,
                              group=pw.pw_gid, env={"PATH": os.environ["PATH"], "SLURM_CONF": CONF, **env})

    run_id = uuid.uuid4().hex[:12]
    mine = as_user("slotqa", ["sbatch", "--parsable", "-o", "/dev/null", "-J", f"slotq-{run_id}", "--time=1",
                              "--hold", "--wrap", "sleep 60"])  # A's run's job (held: it stays pending)
    assert mine.returncode == 0, mine.stderr
    squat = as_user("slotqb", ["sbatch", "--parsable", "-o", "/dev/null", "-J", f"slotq-{run_id}", "--time=1",
                               "--hold", "--wrap", "sleep 60"])  # B's, under A's run's name, after it
    assert squat.returncode == 0, squat.stderr
    root = make_root()
    try:
        env = {"PYTHONPATH": str(users_code()), "HOME": str(root / "home-slotqa")}
        proc = as_user("slotqa", [PY, "-m", "slotq", "cancel", "--slurm", run_id], **env)
        assert proc.returncode == 0, proc.stderr  # before: 77, "belongs to user slotqb"
        assert proc.stderr == f"slotq cancel: cancelled run {run_id} (Slurm job {mine.stdout.strip()})\n"
        assert squeue("-j", squat.stdout.strip(), "-o", "%i").strip() == squat.stdout.strip()  # B's untouched
        again = as_user("slotqa", ["sbatch", "--parsable", "-o", "/dev/null", "-J", f"slotq-{run_id}",
                                   "--time=1", "--hold", "--wrap", "sleep 60"])
        proc = as_user("slotqa", [PY, "-m", "slotq", "cancel", "--slurm", "--mine"], **env)
        assert proc.returncode == 0 and again.stdout.strip() in proc.stderr, proc.stderr  # before: nothing to cancel
    finally:
        shutil.rmtree(root)
