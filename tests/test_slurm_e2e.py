"""`slotq run --slurm` end to end, against the private Slurm cluster that
scripts/test starts (scripts/slurm-test-cluster: munged + slurmctld + slurmd
on 127.0.0.1, one node of 2 CPUs, partitions `test` and `landing`).

Each test drives the installed CLI and checks what Slurm itself says
afterwards (squeue), so a job slotq forgot to cancel fails the test."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import alive, group_alive, history_written, one_line, running_with, slotq_cmd, wait_for, watch_snapshots
from shared_world import users_code
from slotq.client.ledger import Ledger
from slurm_world import (CONF, MAGIC_LOOKALIKE, err, history_line, history_lines, jobs_named, pending_job,
                         pending_run, placeholder, requires_cluster, result, squeue, start)

pytestmark = requires_cluster


@pytest.mark.timeout(60)
def test_seed_scenario_waits_in_slurm_then_passes_with_the_wait_on_record(slurm_env: Path) -> None:
    tmp = slurm_env
    holder = placeholder(tmp, 6)
    proc = start(tmp, "quick", "--budget", "1", "--report-every", "1", "--", "echo", "quick")
    assert proc.wait(timeout=40) == 0, err(tmp, "quick")
    res = result(tmp, "quick")
    assert res["outcome"] == "passed" and (tmp / "quick.out").read_bytes() == b"quick\n"
    assert res["waited_s"] >= 4, res  # the budget of 1 s was never charged for the wait
    lines = err(tmp, "quick")
    assert re.search(r"reason (Resources|Priority)", lines), lines
    assert f"held by job {holder} placeholder-{tmp.name} (user root)" in lines, lines
    # As Slurm had it when the run ended: COMPLETING while the node still
    # tidies up after the job (seen on a busy machine), then COMPLETED.
    assert res["slurm"]["partition"] == "test" and res["slurm"]["state"] in ("COMPLETED", "COMPLETING"), res
    waits = Ledger(str(tmp / "ledger.sqlite")).records(str(tmp))
    [wait] = [w for w in waits if w.run_id == res["run_id"]]
    assert wait.kind == "queue" and wait.end is not None and wait.end - wait.start >= 4
    # The history's line (the node's runner's) has the wait in Slurm's line too: it said 0 ms.
    line = history_line(res["run_id"])
    assert line["outcome"] == "passed" and line["slot"] == f"slurm job {res['slurm']['job_id']}", line
    assert line["waited_s"] >= 4, line


@pytest.mark.timeout(60)
def test_a_slotq_run_holding_the_node_is_named_by_its_label_in_waiting_lines_and_status(slurm_env: Path) -> None:
    # It was named by its job name, `slotq-<run id>`: who held the node said
    # nothing of what it ran (a host's line names the holder's label).
    tmp = slurm_env
    marker = tmp / "holding"
    holder = start(tmp, "holder", "--label", "pr-9|x: the holder", "--slurm-option=--cpus-per-task=2", "--",
                   "sh", "-c", f"touch {marker}; sleep 30")
    wait_for(marker.exists, timeout=20, what="the holder running")
    waiter = start(tmp, "waiter", "--report-every", "1", "--", "true")
    wait_for(lambda: "pr-9|x: the holder (user " in err(tmp, "waiter"), timeout=20, what="the holder named")
    status = subprocess.run(slotq_cmd() + ["status", "--slurm"], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0 and re.search(r"slotq-\w+ \(pr-9\|x: the holder\)  for", status.stdout), \
        status.stdout
    for caller in (waiter, holder):
        caller.send_signal(signal.SIGINT)
        assert caller.wait(timeout=20) == 130


@pytest.mark.timeout(60)
def test_another_users_job_named_in_bytes_that_are_not_utf8_breaks_neither_a_wait_nor_status(
        slurm_env: Path) -> None:
    # Slurm passes job names (and work dirs) on as bytes; anyone may submit
    # one. slotq read squeue's and scontrol's output as strict UTF-8, so
    # such a job in the partition crashed every waiting run's report and
    # `slotq status --slurm`.
    tmp = slurm_env
    holder = placeholder(tmp, 6, suffix=b"-\xff\xfe")
    proc = start(tmp, "behind", "--budget", "5", "--report-every", "1", "--", "echo", "ran")
    assert proc.wait(timeout=40) == 0, err(tmp, "behind")
    assert (tmp / "behind.out").read_bytes() == b"ran\n"
    assert f"held by job {holder} placeholder-{tmp.name}-\ufffd\ufffd (user root)" in err(tmp, "behind")
    holder = placeholder(tmp, 6, suffix=b"-\xff\xfe")
    status = subprocess.run(slotq_cmd() + ["status", "--slurm"], capture_output=True, timeout=30)
    assert status.returncode == 0 and f"job {holder}".encode() in status.stdout, status.stderr


@pytest.mark.timeout(60)
def test_an_overrun_is_exec_timeout_naming_when_the_job_started(slurm_env: Path) -> None:
    tmp = slurm_env
    proc = start(tmp, "long", "--budget", "1", "--kill-grace", "1", "--", "sleep", "30")
    assert proc.wait(timeout=30) == 124
    res = result(tmp, "long")
    assert res["outcome"] == "exec_timeout" and 1 <= res["ran_s"] < 5, res
    job = res["slurm"]["job_id"]
    assert re.search(rf"slurm job {job} started on \S+ at \d\d:\d\d:\d\d", res["message"]), res["message"]
    wait_for(lambda: jobs_named(f"slotq-{res['run_id']}") == "", timeout=10, what="the job gone")


@pytest.mark.timeout(60)
def test_the_idle_watchdog_counts_only_after_the_command_started(slurm_env: Path) -> None:
    tmp = slurm_env
    placeholder(tmp, 4)
    # Pending for ~4 s with --idle 2: the quiet wait never counts.
    waiting = start(tmp, "waits", "--idle", "2", "--", "sh", "-c", "sleep 1; echo ran")
    assert waiting.wait(timeout=40) == 0, err(tmp, "waits")
    assert result(tmp, "waits")["waited_s"] >= 2
    # Once started, silence does count.
    quiet = start(tmp, "quiet", "--idle", "1", "--kill-grace", "1", "--", "sleep", "30")
    assert quiet.wait(timeout=30) == 123
    assert result(tmp, "quiet")["outcome"] == "idle_timeout"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["pid", "group"])
def test_a_sigkilled_pending_caller_has_its_job_cancelled_within_2s_and_its_wait_in_the_history(
        slurm_env: Path, how: str) -> None:
    tmp = slurm_env
    caller, job = pending_run(tmp, "victim")
    assert "PENDING" in squeue("-j", job, "-o", "%T")
    run_id = squeue("-j", job, "-o", "%j").strip().removeprefix("slotq-")
    t0 = time.monotonic()
    if how == "pid":
        caller.kill()
    else:
        os.killpg(caller.pid, signal.SIGKILL)
    caller.wait()
    wait_for(lambda: squeue("-j", job, "-t", "PD,R,CF", "-o", "%i") == "", timeout=5, what="the job cancelled")
    assert time.monotonic() - t0 <= 2.0
    # No node's runner ever ran it: the sentinel says how it ended, as a
    # waiter killed in a local line has its keeper say it.
    wait_for(lambda: history_lines(run_id), timeout=10, what="the run's history line")
    line = history_line(run_id)
    assert (line["outcome"], line["slot"], line["phases"]["started"]) == ("caller_gone", None, None), line
    assert f"pending in Slurm's line; its sentinel cancelled Slurm job {job}" in line["message"], line
    assert line["waited_s"] > 0


@pytest.mark.timeout(60)
def test_a_sigkilled_running_caller_has_its_command_ended_within_grace(slurm_env: Path) -> None:
    tmp = slurm_env
    pidf = tmp / "cmd.pid"
    caller = start(tmp, "victim", "--kill-grace", "1", "--", "sh", "-c",
                   f"trap '' TERM; echo $$ > {pidf}; sleep 300 & sleep 300")
    wait_for(lambda: pidf.exists() and pidf.read_text().strip(), timeout=20, what="the command running")
    pid = int(pidf.read_text())
    run_id = wait_for(lambda: re.search(r"slot slurm job (\d+)", err(tmp, "victim")), what="the slot line")
    job = run_id.group(1)
    t0 = time.monotonic()
    os.killpg(caller.pid, signal.SIGKILL)
    caller.wait()
    wait_for(lambda: not alive(pid) and not group_alive(pid), timeout=1 + 4, what="the command gone")
    assert time.monotonic() - t0 <= 1 + 2
    wait_for(lambda: squeue("-j", job, "-t", "PD,R,CF", "-o", "%i") == "", timeout=10, what="the job gone")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("when", ["pending", "running"])
def test_ctrl_c_is_cancelled_and_leaves_no_job(slurm_env: Path, when: str) -> None:
    tmp = slurm_env
    if when == "pending":
        placeholder(tmp, 30)
    marker = tmp / "started"
    caller = start(tmp, "me", "--report-every", "1", "--kill-grace", "1", "--", "sh", "-c",
                   f"touch {marker}; sleep 300")
    if when == "pending":
        job = pending_job(tmp, "me")
    else:
        wait_for(marker.exists, timeout=20, what="the command running")
    caller.send_signal(signal.SIGINT)
    assert caller.wait(timeout=20) == 130
    res = result(tmp, "me")
    assert res["outcome"] == "cancelled", res
    # Named, here and in the history ("slotq cancelled Slurm job N" was
    # taken for a `slotq cancel`'s message, and the signal went unsaid).
    assert res["message"].startswith("cancelled (Ctrl-C) while "), res
    job = res["slurm"]["job_id"]
    assert job
    if when == "pending":
        assert not marker.exists() and res["phases"]["started"] is None
    wait_for(lambda: jobs_named(f"slotq-{res['run_id']}") == "", timeout=10, what="nothing of the run in squeue")
    # In the history too (a job cancelled while pending was in none: no runner on a node wrote it).
    line = history_line(res["run_id"])
    assert line["outcome"] == "cancelled" and line["waited_s"] > 0, line
    assert (line["slot"] is None) == (when == "pending"), line
    assert line["message"].startswith("cancelled (Ctrl-C) while "), line


@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit", ["0", "2s"])
def test_max_wait_bounds_the_wait_in_slurms_line_and_leaves_no_job(slurm_env: Path, limit: str) -> None:
    # --max-wait counted only on the node, after Slurm's own line: a job
    # pending for an hour waited the hour.
    tmp = slurm_env
    free = start(tmp, "free", "--max-wait", limit, "--", "true")
    assert free.wait(timeout=30) == 0, err(tmp, "free")
    placeholder(tmp, 30)
    marker = tmp / "ran"
    caller = start(tmp, "impatient", "--max-wait", limit, "--", "touch", str(marker))
    assert caller.wait(timeout=30) == 117, err(tmp, "impatient")
    res = result(tmp, "impatient")
    assert res["outcome"] == "not_admitted" and not marker.exists(), res
    assert "--max-wait" in res["message"] and f"Slurm job {res['slurm']['job_id']}" in res["message"], res
    if limit == "2s":
        assert res["waited_s"] >= 2 and "pending 2." in res["message"], res
    wait_for(lambda: jobs_named(f"slotq-{res['run_id']}") == "", timeout=10, what="the job gone")
    line = history_line(res["run_id"])
    assert line["outcome"] == "not_admitted" and line["slot"] is None and line["message"] == res["message"], line
    assert line["waited_s"] >= (2 if limit == "2s" else 0), line


@pytest.mark.timeout(60)
def test_an_admins_scancel_is_cancelled_naming_scancel(slurm_env: Path) -> None:
    tmp = slurm_env
    caller, job = pending_run(tmp, "me")
    subprocess.run(["scancel", job], env=dict(os.environ, SLURM_CONF=CONF), timeout=30, check=True)
    assert caller.wait(timeout=20) == 130
    res = result(tmp, "me")
    assert res["outcome"] == "cancelled" and res["blame"] != "work", res
    assert f"Slurm job {job}" in res["message"] and "scancel" in res["message"] and "pending" in res["message"]
    assert history_line(res["run_id"])["message"] == res["message"]


@pytest.mark.timeout(60)
def test_a_quiet_slurm_run_says_its_command_could_not_be_started(slurm_env: Path) -> None:
    proc = start(slurm_env, "missing", "-q", "--", "no-such-cmd-xyz")
    assert proc.wait(timeout=30) == 127
    assert "command not found: 'no-such-cmd-xyz'" in err(slurm_env, "missing")


@pytest.mark.timeout(60)
def test_output_is_byte_exact_through_slurm(slurm_env: Path) -> None:
    tmp = slurm_env
    blob = os.urandom(200_000) + b"\n" + MAGIC_LOOKALIKE + b"no newline at the end"
    (tmp / "blob").write_bytes(blob)
    proc = start(tmp, "cat", "--", "sh", "-c", f"cat {tmp / 'blob'}; printf 'to stderr\\n' >&2")
    assert proc.wait(timeout=30) == 0, err(tmp, "cat")
    assert (tmp / "cat.out").read_bytes() == blob
    assert "to stderr\n" in err(tmp, "cat")
    assert result(tmp, "cat")["outcome"] == "passed"  # the look-alike event was output, not an ending


@pytest.mark.timeout(60)
def test_classes_map_to_partition_and_qos(slurm_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = slurm_env
    config = tmp / "host.toml"
    config.write_text('[slurm.classes]\nshared = { partition = "test" }\n'
                      'landing = { partition = "landing", qos = "landing" }\n')
    monkeypatch.setenv("SLOTQ_CONFIG", str(config))
    proc = start(tmp, "land", "--class", "landing", "--", "sh", "-c", "squeue -h -j $SLURM_JOB_ID -o %P")
    assert proc.wait(timeout=30) == 0, err(tmp, "land")
    assert (tmp / "land.out").read_text().strip() == "landing"  # what Slurm says, from inside the job
    res = result(tmp, "land")
    assert res["slurm"]["partition"] == "landing" and res["slurm"]["qos"] == "landing", res
    # A class the config does not map: one line, exit 64, nothing submitted.
    bad = subprocess.run(slotq_cmd() + ["run", "--slurm", "--class", "nightly", "--", "true"],
                         capture_output=True, text=True, timeout=30, cwd=tmp)
    assert bad.returncode == 64 and "class 'nightly' has no Slurm partition" in one_line(bad)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["config", "option"])
def test_a_bad_partition_is_one_line_and_exit_64(slurm_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                where: str) -> None:
    tmp = slurm_env
    args = ["run", "--slurm", "--", "true"]
    if where == "config":
        (tmp / "host.toml").write_text('[slurm.classes]\nshared = { partition = "nosuch" }\n')
        monkeypatch.setenv("SLOTQ_CONFIG", str(tmp / "host.toml"))
    else:
        args[2:2] = ["--slurm-option=--partition=nosuch"]
    proc = subprocess.run(slotq_cmd() + args, capture_output=True, text=True, timeout=30, cwd=tmp)
    assert proc.returncode == 64
    assert "Slurm refused the job" in one_line(proc) and "Invalid partition" in one_line(proc)
    # The run's sentinel (its liveness while a job is pending) was told the
    # run is over: it did not take the exit for a vanished caller and write
    # `caller_gone` in the history (it did, a second later, and made the
    # state dir to do it).
    wait_for(lambda: not running_with(str(tmp / "state")), what="the run's sentinel gone")
    lines = history_written(tmp / "state")
    assert "caller_gone" not in [line.get("outcome") for line in lines], lines


@pytest.mark.timeout(60)
def test_a_job_over_its_partitions_time_limit_is_refused_not_left_pending_forever(
        slurm_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Slurm accepts a job whose --time is over the partition's MaxTime and
    # keeps it pending (reason PartitionTimeLimit) until someone raises the
    # limit: the run waited forever, reported as a place in line.
    tmp = slurm_env
    part = f"short{os.getpid()}"
    scontrol = ["scontrol", "create", f"PartitionName={part}", "Nodes=ALL", "MaxTime=1", "State=UP"]
    env = dict(os.environ, SLURM_CONF=CONF)
    assert subprocess.run(scontrol, capture_output=True, timeout=30, env=env).returncode == 0
    try:
        (tmp / "host.toml").write_text(f'[slurm.classes]\nshort = {{ partition = "{part}" }}\n')
        monkeypatch.setenv("SLOTQ_CONFIG", str(tmp / "host.toml"))
        proc = start(tmp, "long", "--class", "short", "--budget", "1h", "--report-every", "0.5s", "--", "true")
        assert proc.wait(timeout=40) == 64, err(tmp, "long")
        line = err(tmp, "long").strip().splitlines()[-1]
        assert line.startswith(f"slotq run: error: Slurm refused the job (partition '{part}'): Slurm job ") and \
            "would never start as asked, pending for reason PartitionTimeLimit: " in line and \
            "ask for a shorter --budget; slotq cancelled it" in line, line
        assert not (tmp / "long.json").exists()  # a refusal, as at submission: no result
        assert squeue("-p", part, "-o", "%i") == ""  # nothing left pending there
        # Within the limit, the same class runs.
        proc = start(tmp, "short", "--class", "short", "--budget", "5s", "--kill-grace", "1s",
                     "--slurm-option=--time=1", "--", "true")
        assert proc.wait(timeout=30) == 0, err(tmp, "short")
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={part}"], capture_output=True, timeout=30, env=env)


@pytest.mark.timeout(90)
def test_slurm_down_is_unavailable_with_a_clear_message(slurm_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = slurm_env
    down = tmp / "slurm-down.conf"
    down.write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=9", Path(CONF).read_text()))
    monkeypatch.setenv("SLURM_CONF", str(down))
    proc = start(tmp, "down", "--", "true")
    assert proc.wait(timeout=80) == 121
    res = result(tmp, "down")
    assert res["outcome"] == "unavailable" and res["blame"] == "infrastructure"
    assert "Slurm is not answering" in res["message"] and "slurm controller" in res["message"], res


@pytest.mark.timeout(60)
def test_a_work_dir_the_node_cannot_see_is_unavailable_naming_node_and_path(slurm_env: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    tmp = slurm_env
    mnt = tmp / "private"
    mnt.mkdir()
    # A directory only this caller sees (its own mount namespace): as a work
    # tree on a disk that is not shared with the nodes.
    script = (f"mount -t tmpfs none {mnt} && mkdir {mnt}/work && cd {mnt}/work && "
              f"exec {' '.join(slotq_cmd())} run --slurm --json {tmp}/nodir.json -- true")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 121, proc.stderr
    res = result(tmp, "nodir")
    assert res["outcome"] == "unavailable" and f"{mnt}/work" in res["message"], res
    assert f"on node {os.uname().nodename}" in res["message"], res


@pytest.mark.timeout(60)
def test_an_ordinary_user_runs_through_slurm(slurm_env: Path) -> None:
    users = [u for u in os.environ.get("SLOTQ_TEST_USERS", "").split(",") if u]
    if not users:
        pytest.skip("no test users (scripts/test-users)")
    pw = pwd.getpwnam(users[0])
    root = Path(tempfile.mkdtemp(prefix="slotq-slurm-user-"))  # pytest's tmp is root's alone (0700)
    try:
        _run_as(pw, root)
    finally:
        shutil.rmtree(root)


def _run_as(pw: pwd.struct_passwd, root: Path) -> None:
    os.chmod(root, 0o755)
    home = root / "home"
    home.mkdir()
    os.chown(home, pw.pw_uid, pw.pw_gid)
    # Debian's python with the users' copy of the code: they can reach
    # neither root's interpreter nor, in a private clone, the checkout.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "SLURM_CONF": CONF, "USER": pw.pw_name,
           "PYTHONPATH": str(users_code()), "PYTHONDONTWRITEBYTECODE": "1",
           "SLOTQ_STATE_DIR": str(home / "state"), "SLOTQ_LEDGER": str(home / "ledger.sqlite")}
    proc = subprocess.run(["/usr/bin/python3", "-m", "slotq", "run", "--slurm", "--json", "-", "--", "id", "-un"],
                          capture_output=True,
                          text=True, timeout=30, cwd=home, env=env, user=pw.pw_uid, group=pw.pw_gid,
                          extra_groups=[])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{pw.pw_name}\n")
    res = json.loads(proc.stdout.split("\n", 1)[1])
    assert res["outcome"] == "passed" and res["slurm"]["job_id"]


def test_slurms_time_limit_is_a_backstop_covering_budget_grace_and_margin(slurm_env: Path) -> None:
    from slotq.config import HostConfig
    from slotq.spec import RunSpec
    from slotq.transports.slurm import SlurmTransport

    t = SlurmTransport(HostConfig(), options=["--cpus-per-task=2"])
    argv = t.srun_argv(RunSpec(["true"], budget=600, kill_grace=30))
    assert "--time=13" in argv  # 600 + 30 + 120 s, rounded up to minutes
    assert argv.index("--cpus-per-task=2") < argv.index("host")  # options go to srun, not to the command
    # A --time of the user's own is theirs.
    t = SlurmTransport(HostConfig(), options=["--time=90"])
    assert not [a for a in t.srun_argv(RunSpec(["true"])) if a.startswith("--time=") and a != "--time=90"]


@pytest.mark.timeout(60)
def test_slotq_task_credits_the_time_a_job_was_pending(slurm_env: Path) -> None:
    tmp = slurm_env
    placeholder(tmp, 6)
    out = tmp / "task.json"
    # The task's budget (2 s) is far less than the job waits in Slurm; the
    # wait is credited, so the task outlives its budget and passes.
    proc = subprocess.run(slotq_cmd() + ["task", "--json", str(out), "--budget", "2s", "--recheck", "1s",
                                         "--credit-dir", str(tmp), "--", *slotq_cmd(), "run", "--slurm",
                                         "--report-every", "1", "--", "true"],
                          capture_output=True, text=True, timeout=50, cwd=tmp)
    res = json.loads(out.read_text())
    assert proc.returncode == 0 and res["outcome"] == "passed", proc.stderr
    assert res["budget_s"] == 2.0 and res["elapsed_s"] > 4.0, res  # alive past its budget: the wait counted


@pytest.mark.timeout(60)
def test_status_slurm_shows_each_configured_partitions_queue(slurm_env: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = slurm_env
    (tmp / "host.toml").write_text('[slurm.classes]\nshared = { partition = "test" }\n'
                                   'landing = { partition = "landing" }\n')
    monkeypatch.setenv("SLOTQ_CONFIG", str(tmp / "host.toml"))
    holder = placeholder(tmp, 30)
    caller = start(tmp, "waiting", "--report-every", "1", "--", "true")
    job = pending_job(tmp, "waiting")
    proc = subprocess.run(slotq_cmd() + ["status", "--slurm", "--json"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    views = {v["partition"]: v for v in json.loads(proc.stdout)["partitions"]}
    assert set(views) == {"test", "landing"}
    assert [r["job_id"] for r in views["test"]["running"]] == [holder]
    [mine] = [p for p in views["test"]["pending"] if p["job_id"] == job]
    assert mine["reason"] in ("Resources", "Priority") and mine["name"].startswith("slotq-")
    text = subprocess.run(slotq_cmd() + ["status", "--slurm"], capture_output=True, text=True, timeout=30).stdout
    assert f"running   job {holder}  root  placeholder-{tmp.name}" in text, text
    assert re.search(rf"pending +\d+\. job {job}  root  slotq-\w+ \(root: true\)  reason (Resources|Priority)",
                     text), text  # its run id (for slotq cancel --slurm), then its label
    code, out = watch_snapshots(["--slurm", "--every", "0.2"], count=2)
    snaps = [s for s in out.split("--- ")[1:] if s.strip()]
    assert code == 0 and len(snaps) >= 2 and all(f"job {job}" in s for s in snaps[:2]), out
    caller.kill()
    caller.wait()


@pytest.mark.timeout(60)
def test_status_slurm_says_a_partition_slurm_does_not_have(slurm_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # squeue shows an unknown partition as an empty queue: "0 running, 0
    # pending", all well, while Slurm refused every run of its class.
    (slurm_env / "host.toml").write_text('[slurm.classes]\nshared = { partition = "test" }\n'
                                         'nightly = { partition = "nosuch" }\n')
    monkeypatch.setenv("SLOTQ_CONFIG", str(slurm_env / "host.toml"))
    text = subprocess.run(slotq_cmd() + ["status", "--slurm"], capture_output=True, text=True, timeout=30).stdout
    assert "partition nosuch (classes nightly): Slurm has no such partition (runs of these classes are refused)" \
        in text and "partition test (classes shared): 0 running, 0 pending" in text, text
    proc = subprocess.run(slotq_cmd() + ["status", "--slurm", "--json"], capture_output=True, text=True, timeout=30)
    views = {v["partition"]: v for v in json.loads(proc.stdout)["partitions"]}
    assert views["nosuch"]["missing"] is True and "missing" not in views["test"], views


@pytest.mark.timeout(60)
def test_slurms_tools_not_installed_is_one_line_naming_them(slurm_env: Path, tmp_path: Path) -> None:
    # It was "squeue failed: [Errno 2] No such file or directory: 'squeue'".
    env = dict(os.environ, PATH=str(tmp_path))  # no Slurm tools there (slotq_cmd is an absolute path)
    for cmd, tool in ((["cancel", "--slurm", "--mine"], "squeue"), (["status", "--slurm"], "sinfo")):
        proc = subprocess.run(slotq_cmd() + cmd, capture_output=True, text=True, timeout=30, env=env)
        assert proc.returncode == 121 and f"{tool} is not installed here (Slurm's client tools)" in one_line(proc)


@pytest.mark.parametrize("toml, needle", [
    ('[slurm]\ncolour = "blue"\n', "unknown setting(s) ['colour']"),
    ('[slurm.classes]\nshared = "test"\n', "classes.shared must be { partition = NAME"),
    ('[slurm.classes]\nshared = { partition = "a b" }\n', "classes.shared must be { partition = NAME"),
    ('[slurm]\noptions = "--account=x"\n', "options must be a list of Slurm options"),
])
def test_a_bad_slurm_section_is_one_line_exit_78(slurm_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                 toml: str, needle: str) -> None:
    (slurm_env / "host.toml").write_text(toml)
    monkeypatch.setenv("SLOTQ_CONFIG", str(slurm_env / "host.toml"))
    proc = subprocess.run(slotq_cmd() + ["run", "--slurm", "--", "true"], capture_output=True, text=True,
                          timeout=30, cwd=slurm_env)
    assert proc.returncode == 78 and needle in one_line(proc)
