"""Remote hosts over a real OpenSSH server on 127.0.0.1 (scripts/sshd-test-server)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

from conftest import Run, alive, slotq_cmd, wait_for, watch_snapshots
from remote_host import Remote, runs_in
from slotq.client.ledger import Ledger
from slotq.transports.ssh import SshHost

Start = Callable[..., Run]


@pytest.mark.timeout(60)
def test_queue_longer_than_budget_passes_over_ssh(remote: Remote, runs: Start) -> None:
    holder = runs(*remote.args, "--label", "placeholder", "--", *remote.gate_cmd(), name="holder")
    wait_for(remote.holder_running, timeout=20, what="remote placeholder holds the slot")
    r = runs(*remote.args, "--budget", "1", "--report-every", "1", "--", "echo", "ran")
    wait_for(lambda: [w.get("waited_s", 0) for w in remote.shared()["waiting"]][:1] > [4.0], timeout=30,
             what="4 s of waiting on the host")
    assert remote.holder_running()
    remote.ssh(f"touch {remote.gate()}")
    assert r.wait(timeout=40) == 0, r.err
    res = r.result()
    assert res["outcome"] == "passed" and r.out == b"ran\n"
    assert res["waited_s"] >= 4.0
    assert res["host"] == "slotq-test" and res["transport"]["kind"] == "ssh"
    assert "slot held by placeholder" in r.err
    queued = [w for w in Ledger().credit(str(r.out_path.parent), 0, time.time()).waits
              if w.record.run_id == res["run_id"] and w.record.kind == "queue"]
    assert len(queued) == 1 and queued[0].seconds >= 4.0 and queued[0].record.host == "slotq-test"
    assert holder.wait(timeout=20) == 0


@pytest.mark.timeout(60)
def test_sigkill_of_the_local_run_while_queued_withdraws_the_remote_ticket(remote: Remote, runs: Start) -> None:
    runs(*remote.args, "--", *remote.gate_cmd(), name="holder")
    wait_for(remote.holder_running, timeout=20, what="remote holder")
    q = runs(*remote.args, "--", "true", name="queued")
    wait_for(lambda: len(remote.shared()["waiting"]) == 1, timeout=20, what="remote ticket")
    t0 = time.monotonic()
    q.kill()
    wait_for(lambda: remote.shared()["waiting"] == [], timeout=2.0, what="remote ticket gone")
    assert time.monotonic() - t0 <= 2.5  # 2 s, plus one status round trip to observe it


def _remote_pgid(remote: Remote) -> int:
    text = wait_for(lambda: remote.ssh(f"cat /tmp/slotq-pg-{remote.tag} 2>/dev/null").strip(), timeout=20,
                    what="remote command running")
    return int(text)


@pytest.mark.timeout(60)
def test_sigkill_of_the_local_run_while_running_ends_the_remote_group(remote: Remote, runs: Start) -> None:
    r = runs(*remote.args, "--kill-grace", "1", "--", "sh", "-c",
             f"trap '' TERM; echo $$ > /tmp/slotq-pg-{remote.tag}; sleep 100 & sleep 100")
    pgid = _remote_pgid(remote)
    assert remote.group_members(pgid) >= 2
    t0 = time.monotonic()
    r.kill()
    wait_for(lambda: remote.group_members(pgid) == 0, timeout=1 + 2, what="remote process group gone")
    assert time.monotonic() - t0 <= 1 + 2 + 0.5
    wait_for(lambda: not remote.shared()["slots"][0]["held"], timeout=5, what="remote slot free")


@pytest.mark.timeout(60)
def test_sigkill_of_ssh_itself_is_unavailable_and_ends_the_remote_group(remote: Remote, runs: Start) -> None:
    r = runs(*remote.args, "--kill-grace", "1", "--", "sh", "-c", f"echo $$ > /tmp/slotq-pg-{remote.tag}; sleep 100")
    pgid = _remote_pgid(remote)
    assert remote.group_members(pgid) >= 1  # seen alive first: the check below can fail
    ssh_pids = [int(p) for p in Path(f"/proc/{r.proc.pid}/task/{r.proc.pid}/children").read_text().split()
                if Path(f"/proc/{p}/comm").read_text().strip() == "ssh"]
    assert len(ssh_pids) == 1
    os.kill(ssh_pids[0], signal.SIGKILL)
    assert r.wait(timeout=20) == 121
    res = r.result()
    assert res["outcome"] == "unavailable" and res["blame"] == "infrastructure"
    assert "slotq-test" in res["message"]
    wait_for(lambda: remote.group_members(pgid) == 0, timeout=1 + 2, what="remote process group gone")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("victim", ["runner", "keeper", "both"])
def test_sigkill_of_the_remote_runner_or_supervisor_ends_the_remote_command(
        remote: Remote, runs: Start, victim: str) -> None:
    # The test host is this machine: the remote runner and its keeper are
    # processes here (of the ssh test user), and we may kill them.
    r = runs(*remote.args, "--kill-grace", "1", "--", "sh", "-c",
             f"trap '' TERM HUP; echo $$ > /tmp/slotq-pg-{remote.tag}; sleep 100 & sleep 100")
    pgid = _remote_pgid(remote)
    slot = wait_for(lambda: (s := remote.shared()["slots"][0]).get("keeper") and s, timeout=20,
                    what="the remote holder record")
    runner, keeper = int(slot["pid"]), int(slot["keeper"])
    t0 = time.monotonic()
    if victim == "both":
        os.kill(runner, signal.SIGSTOP)  # it must not see its keeper go
    if victim in ("keeper", "both"):
        os.kill(keeper, signal.SIGKILL)
        wait_for(lambda: not alive(keeper), what="keeper gone")
    if victim in ("runner", "both"):
        os.kill(runner, signal.SIGKILL)
    assert r.wait(timeout=30) == 121
    assert remote.group_members(pgid) == 0
    assert time.monotonic() - t0 <= 1 + 2 + 2  # grace + 2 s, plus the ssh round trips
    res = r.result()
    assert res["outcome"] == "unavailable" and res["blame"] == "infrastructure"
    expected = {
        "runner": f"its runner (pid {runner}) was gone; its keeper (pid {keeper}) ended the command",
        "keeper": f"the command's supervisor (slotq keeper, pid {keeper}) was killed after the command started",
        "both": f"its runner (pid {runner}) and keeper (pid {keeper}) were both gone; slotq ended the orphaned command",
    }[victim]
    assert expected in res["message"], res["message"]
    wait_for(lambda: not remote.shared()["slots"][0]["held"], timeout=5, what="remote slot free")


@pytest.mark.timeout(60)
def test_cancel_over_ssh_ends_a_remote_run_also_named_after_a_host_that_is_down(remote: Remote,
                                                                                runs: Start) -> None:
    r = runs(*remote.args, "--kill-grace", "1", "--", *remote.gate_cmd(), name="remote-run")
    wait_for(remote.holder_running, timeout=20, what="remote run holds the slot")
    run_id = remote.shared()["slots"][0]["run_id"]
    from conftest import reachable  # the test host is this machine

    wait_for(lambda: reachable(run_id), what="the remote run to listen for cancel")
    # A host that cannot be reached, first in the list, ended the command
    # there and then: the run on the next was never cancelled.
    args = [*remote.args]
    args[args.index("--host") + 1] = f"slotq-down,{remote.host}"
    proc = subprocess.run(slotq_cmd() + ["cancel", *args, run_id], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 121, proc.stderr
    assert f"cancelled run {run_id}" in proc.stderr
    assert "slotq cancel: error: cannot connect to host slotq-down" in proc.stderr
    assert r.wait(timeout=20) == 130
    assert r.result()["outcome"] == "cancelled" and "cancelled by slotq cancel (pid" in r.result()["message"]
    proc = subprocess.run(slotq_cmd() + ["cancel", *remote.args, "nosuchrun1"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 66, proc.stderr


HOSTILE = ["a b", "'single'", '"double"', "$(echo pwned)", "`echo pwned`", "; rm -rf /tmp/nope", "a\nb\n",
           "ünïcödé ✓ 日本", "*", "", "\\", "$HOME", "--", "-x"]


@pytest.mark.timeout(60)
def test_hostile_arguments_arrive_byte_exact(remote: Remote) -> None:
    proc = subprocess.run(slotq_cmd() + ["run", "-q", *remote.args, "--", "python3", "-c",
                                         "import sys, json; print(json.dumps(sys.argv[1:]))", *HOSTILE],
                          capture_output=True, timeout=40)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == HOSTILE


@pytest.mark.timeout(60)
def test_arguments_that_are_not_utf8_arrive_byte_exact_under_a_label_of_valid_text(remote: Remote) -> None:
    arg = b"\xff\xfe-\x80"
    proc = subprocess.run(slotq_cmd() + ["run", "-q", *remote.args, "--json", "-", "--", "echo", os.fsdecode(arg)],
                          capture_output=True, timeout=40)
    assert proc.returncode == 0, proc.stderr
    out, result = proc.stdout.split(b"\n", 1)
    assert out == arg
    assert json.loads(result)["label"].endswith(": echo \\xff\\xfe-\\x80")  # valid text, as the host keeps it


@pytest.mark.timeout(60)
@pytest.mark.parametrize("host,extra,needle", [
    ("slotq-down", [], "Connection refused"),
    ("slotq-badkey", [], "Permission denied"),
    ("slotq-test", ["--remote-slotq", "/opt/nowhere/slotq"], "slotq is not installed on host slotq-test"),
])
def test_unreachable_wrong_key_or_no_slotq_is_unavailable(ssh_config: str, state_dir: Path, tmp_path: Path,
                                                           host: str, extra: list[str], needle: str) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run(slotq_cmd() + ["run", "--json", str(out), "--host", host, "--ssh-config", ssh_config,
                                         *extra, "--", "true"], capture_output=True, text=True, timeout=40)
    assert proc.returncode == 121
    res = json.loads(out.read_text())
    assert res["outcome"] == "unavailable" and needle in res["message"]
    assert needle in proc.stderr.strip().splitlines()[-1]


@pytest.mark.timeout(60)
def test_a_second_run_reuses_the_master_connection(remote: Remote, tmp_path: Path) -> None:
    subprocess.run(["ssh", "-F", remote.cfg, "-O", "exit", remote.host], capture_output=True, timeout=20)
    from slotq.transports.ssh import SshHost

    # Close any master slotq left for this host, to measure a fresh one.
    sh = SshHost(remote.host, config=remote.cfg)
    subprocess.run(sh._base() + ["-O", "exit", remote.host], capture_output=True, timeout=20)
    times = []
    for i in range(2):
        out = tmp_path / f"r{i}.json"
        proc = subprocess.run(slotq_cmd() + ["run", "-q", "--json", str(out), *remote.args, "--", "true"],
                              capture_output=True, text=True, timeout=40, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        times.append(json.loads(out.read_text())["transport"])
    first, second = times
    assert first["master_reused"] is False and second["master_reused"] is True
    assert second["connect_s"] < first["connect_s"]
    print(f"\nmaster connection: new {first['connect_s'] * 1000:.1f} ms, reused {second['connect_s'] * 1000:.1f} ms")


@pytest.mark.timeout(90)
def test_spread_1_picks_the_host_with_the_shortest_expected_wait_and_says_why(ssh_config: str, state_dir: Path,
                                                                   runs: Start) -> None:
    a = Remote(ssh_config, "slotq-a")
    gate = f"/tmp/slotq-gate-multi-{a.tag}"
    common = ["--ssh-config", ssh_config]
    holder = runs("--host", "slotq-a", *common, "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.01; done",
                  name="holder")
    try:
        def a_busy() -> bool:
            proc = subprocess.run(slotq_cmd() + ["status", "--json", "--host", "slotq-a", *common],
                                  capture_output=True, text=True, timeout=20)
            return bool(json.loads(proc.stdout)["pools"][0]["slots"][0]["held"])

        wait_for(a_busy, timeout=20, what="slotq-a busy")
        proc = subprocess.run(slotq_cmd() + ["run", "--host", "slotq-a,slotq-b", "--spread", "1", *common, "--",
                                             "true"],
                              capture_output=True, text=True, timeout=40)
        assert proc.returncode == 0, proc.stderr
        choice = next(line for line in proc.stderr.splitlines() if "chose host" in line)
        assert "chose host slotq-b" in choice and "slotq-a: ~" in choice and "1 of 1 slot(s) busy" in choice
    finally:
        a.ssh(f"touch {gate}")
        holder.wait(timeout=20)
        a.ssh(f'rm -rf {gate} "$SLOTQ_STATE_DIR"')  # slotq-a's state dir (its SetEnv)
        Remote(ssh_config, "slotq-b").ssh('rm -rf "$SLOTQ_STATE_DIR"')


@pytest.mark.timeout(90)
def test_status_of_several_hosts_is_one_json_list_and_a_host_that_is_down_hides_no_other(
        ssh_config: str, state_dir: Path, tmp_path: Path) -> None:
    # It was one JSON document after another (no JSON reader takes that),
    # the first host that could not be reached ended it with no word of
    # the others, and --history N was not passed on (always 10).
    common = ["--ssh-config", ssh_config]
    a = Remote(ssh_config, "slotq-a")
    try:
        for _ in range(2):
            proc = subprocess.run(slotq_cmd() + ["run", "-q", "--host", "slotq-a", *common, "--", "true"],
                                  capture_output=True, text=True, timeout=40, stdin=subprocess.DEVNULL, cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
        proc = subprocess.run(slotq_cmd() + ["status", "--json", "--history", "1", "--host",
                                             "slotq-a,slotq-down,slotq-b", *common],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 121, proc.stderr
        snaps = json.loads(proc.stdout)
        assert isinstance(snaps, list) and len(snaps) == 2
        assert [len(snap["history"]) for snap in snaps] == [1, 0]
        assert [snap["reached_as"] for snap in snaps] == ["slotq-a", "slotq-b"]  # which is which
        assert len(proc.stderr.splitlines()) == 1
        assert proc.stderr.startswith("slotq status: error: cannot connect to host slotq-down:"), proc.stderr
        assert "Connection refused" in proc.stderr
        proc = subprocess.run(slotq_cmd() + ["status", "--host", "slotq-down,slotq-a,slotq-b", *common],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 121 and proc.stdout.count("pool shared") == 2, proc.stdout
        # Each headed by the name it was reached by (both are this machine: "host vm" twice said nothing).
        heads = [line.split("  ")[0] for line in proc.stdout.splitlines() if line.startswith("host ")]
        assert heads == [f"host slotq-a ({os.uname().nodename})", f"host slotq-b ({os.uname().nodename})"], heads
        # Another slotq's JSON: one line naming the host, not a traceback.
        odd = subprocess.run(slotq_cmd() + ["status", "--host", "slotq-a", *common, "--remote-slotq",
                                            'echo \'{"pools": [1]}\'; :'],
                             capture_output=True, text=True, timeout=60)
        assert odd.returncode == 121 and odd.stdout == "", odd.stdout
        assert odd.stderr == ("slotq status: error: host slotq-a: unreadable status (not a slotq status this "
                              "client can show; --json gives it as it came)\n"), odd.stderr
    finally:
        a.ssh('rm -rf "$SLOTQ_STATE_DIR"')
        Remote(ssh_config, "slotq-b").ssh('rm -rf "$SLOTQ_STATE_DIR"')


@pytest.mark.timeout(60)
def test_a_host_whose_status_hangs_or_floods_is_unavailable_in_bounded_time_and_memory(
        remote: Remote, monkeypatch: pytest.MonkeyPatch) -> None:
    # A hung host was a traceback (subprocess.TimeoutExpired) after 60 s;
    # a status of any size was read whole into memory.
    from slotq.errors import HostUnavailable
    from slotq.transports import ssh

    monkeypatch.setattr(ssh, "STATUS_TIMEOUT", 1.0)
    monkeypatch.setattr(ssh, "STATUS_LIMIT", 1 << 20)
    pidf = f"/tmp/slotq-hang-{remote.tag}"
    host = ssh.SshHost(remote.host, config=remote.cfg, remote_slotq=f"echo $$ > {pidf}; exec sleep 30; :")
    host.ensure_master()
    t0 = time.monotonic()
    try:
        with pytest.raises(HostUnavailable, match="no status within 1s"):
            host.status()
        assert time.monotonic() - t0 < 10
    finally:
        remote.ssh(f"kill $(cat {pidf}); rm -f {pidf}")  # the host's sleep outlives our ssh
    host.remote_slotq = "head -c 5000000 /dev/zero; true"
    with pytest.raises(HostUnavailable, match="its status is larger than 1 MiB"):
        host.status()
    host.remote_slotq = remote.remote_slotq
    assert '"pools"' in host.status()


@pytest.mark.timeout(60)
def test_a_quiet_remote_run_says_its_command_could_not_be_started(remote: Remote, tmp_path: Path) -> None:
    proc = runs_in(tmp_path, remote, "--", "no-such-cmd-xyz")
    assert proc.returncode == 127
    assert "command not found: 'no-such-cmd-xyz'" in proc.stderr, proc.stderr


@pytest.mark.timeout(60)
def test_a_command_the_host_cannot_start_fails_before_its_line(remote: Remote, runs: Start, tmp_path: Path) -> None:
    # Checked by the host's runner before it takes a ticket (issue 48): the
    # host's PATH and the work dir there are what its exec would use.
    runs(*remote.args, "--", *remote.gate_cmd(), name="holder")
    wait_for(remote.holder_running, timeout=20, what="remote holder")
    base = f"$HOME/st-{remote.tag}"  # the remote fixture removes it: a kept run's dir, beside the ledger, too
    ledger = ["--remote-slotq", f"SLOTQ_STATE_DIR={base} SLOTQ_LEDGER={base}/l/ledger.sqlite slotq"]
    for kept in ([], ["--detach"]):
        proc = runs_in(tmp_path, remote, *ledger, *kept, "--", "no-such-cmd-xyz")
        assert proc.returncode == 127, proc.stderr
        assert "command not found: 'no-such-cmd-xyz'" in proc.stderr, proc.stderr
        record = json.loads(proc.stdout.splitlines()[-1])
        assert (record["outcome"], record["command_exit_code"], record["ticket"]) == ("failed", 127, None), record
        assert remote.shared()["waiting"] == [] and remote.holder_running()
    remote.ssh(f"touch {remote.gate()}")


@pytest.mark.timeout(60)
def test_a_runtime_dir_too_long_for_a_socket_or_relative_is_not_used_for_masters(
        remote: Remote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A long $XDG_RUNTIME_DIR made every remote run `unavailable` (ssh:
    # "path ... too long for Unix domain socket"); a relative one put the
    # masters in a different place in each working directory.
    from slotq.transports import controldir, ssh

    session_runtime = os.environ["XDG_RUNTIME_DIR"]
    fallback = Path(tempfile.mkdtemp(prefix="sq-"))  # short, as /tmp: a socket fits below it
    host = None
    try:
        monkeypatch.setattr(controldir, "FALLBACK_BASE", str(fallback))
        mine = str(fallback / f"slotq-ssh-{os.getuid()}")
        monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")
        assert os.path.dirname(ssh.SshHost(remote.host, config=remote.cfg).control_path) == mine
        long = tmp_path / ("r" * 60)
        long.mkdir(mode=0o700)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(long))
        host = ssh.SshHost(remote.host, config=remote.cfg)
        assert os.path.dirname(host.control_path) == mine
        host.ensure_master()
        reached = subprocess.run(host.command("echo reached"), capture_output=True, text=True, timeout=20)
        assert reached.returncode == 0 and reached.stdout == "reached\n", reached.stderr
    finally:
        if host is not None:
            subprocess.run(["ssh", "-S", host.control_path, "-O", "exit", "x"], capture_output=True, timeout=20)
        shutil.rmtree(fallback)
    # A short one is used as it is: the session's (conftest), as every test's.
    monkeypatch.setenv("XDG_RUNTIME_DIR", session_runtime)
    assert os.path.dirname(ssh.SshHost(remote.host, config=remote.cfg).control_path) == \
        os.path.join(session_runtime, "slotq-ssh")


def test_status_over_ssh_shows_the_remote_queue(remote: Remote) -> None:
    proc = subprocess.run(slotq_cmd() + ["status", *remote.args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "pool shared" in proc.stdout and "/st-" in proc.stdout
    code, out = watch_snapshots([*remote.args, "--every", "0.2"], count=2)
    snaps = [s for s in out.split("--- ")[1:] if s.strip()]
    assert code == 0 and len(snaps) >= 2 and all("pool shared" in s and "/st-" in s for s in snaps[:2]), out


@pytest.mark.timeout(90)
def test_the_handshake_is_once_per_master_connection(remote: Remote, tmp_path: Path) -> None:
    # The remote slotq, through a shell function that logs each call.
    log = f"$HOME/st-{remote.tag}/calls"
    remote.remote_slotq = (f'f() {{ mkdir -p $HOME/st-{remote.tag}; echo "$*" >> {log}; '
                           f'SLOTQ_STATE_DIR=$HOME/st-{remote.tag} slotq "$@"; }}; f')
    remote.args[remote.args.index("--remote-slotq") + 1] = remote.remote_slotq
    (tmp_path / "f.txt").write_text("one")
    for _ in range(2):
        proc = runs_in(tmp_path, remote, "--", "cat", "f.txt")
        assert proc.returncode == 0 and proc.stdout.startswith("one"), proc.stderr
    calls = remote.ssh(f"cat {log}").splitlines()
    assert calls == ["host hello"] + ["host run --request-stdin --await-sync"] * 2, calls
    # A new master connection: a new handshake (the host may have changed).
    control = SshHost(remote.host, config=remote.cfg).control_path
    stop = subprocess.run(["ssh", "-F", remote.cfg, "-o", f"ControlPath={control}", "-O", "exit", remote.host],
                          capture_output=True, text=True, timeout=20)
    assert stop.returncode == 0, stop.stderr
    proc = runs_in(tmp_path, remote, "--", "true")
    assert proc.returncode == 0, proc.stderr
    calls = remote.ssh(f"cat {log}").splitlines()
    assert calls[3:] == ["host hello", "host run --request-stdin --await-sync"], calls




@pytest.mark.timeout(90)
def test_a_remote_run_left_says_the_attach_that_comes_back_to_it(remote: Remote, runs: Start,
                                                                 tmp_path: Path) -> None:
    # Issue 66: the hint said `slotq attach ID` without the --host it
    # needs; following it gave 64 (no such run here).
    import shlex

    runs(*remote.args, "--", *remote.gate_cmd(), name="holder")
    wait_for(remote.holder_running, timeout=20, what="remote holder")
    base = f"$HOME/st-{remote.tag}"
    args = [a if a != remote.remote_slotq else f"SLOTQ_STATE_DIR={base} SLOTQ_LEDGER={base}/l/ledger.sqlite slotq"
            for a in remote.args]
    left = subprocess.run(slotq_cmd() + ["run", "--attach-for", "1s", *args, "--", "echo", "came"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert left.returncode == 75, left.stderr
    hint = left.stderr.strip().splitlines()[-1]
    said = hint.split("come back with `", 1)[1].split("`", 1)[0]
    argv = shlex.split(said)
    assert argv[:2] == ["slotq", "attach"] and "--host" in argv, hint
    remote.ssh(f"touch {remote.gate()}")
    back = subprocess.run(slotq_cmd() + argv[1:], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)
    assert back.returncode == 0 and back.stdout == "came\n", back.stderr  # the hint, followed, works


@pytest.mark.timeout(120)
def test_a_remote_runs_record_reads_the_same_live_attached_and_in_the_hosts_history(
        remote: Remote, runs: Start, tmp_path: Path) -> None:
    # Issue 66: `transferred` came after `slot`, even after `ended` (an
    # attach's own connection, made when the run was long over), and its
    # transfer_s was the attach's 2 ms against the submission's 66.
    from slotq import record

    base = f"$HOME/st-{remote.tag}"
    args = [a if a != remote.remote_slotq else f"SLOTQ_STATE_DIR={base} SLOTQ_LEDGER={base}/l/ledger.sqlite slotq"
            for a in remote.args]
    runs(*args, "--", *remote.gate_cmd(), name="holder")
    wait_for(remote.holder_running, timeout=20, what="remote holder")
    plain = runs("-q", *args, "--label", "plain", "--", "sh", "-c", "exit 3", name="plain")
    left = subprocess.run(slotq_cmd() + ["run", "--attach-for", "1s", "--json", str(tmp_path / "left.json"), *args,
                                         "--", "sh", "-c", "exit 4"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert left.returncode == 75, left.stderr
    kept_id = json.loads((tmp_path / "left.json").read_text())["run_id"]
    remote.ssh(f"touch {remote.gate()}")
    assert plain.wait(timeout=60) == 3
    live = plain.result()
    back = subprocess.run(slotq_cmd() + ["attach", kept_id, "--json", str(tmp_path / "back.json"), *args],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert back.returncode == 4, back.stderr
    attached = json.loads((tmp_path / "back.json").read_text())
    listed = subprocess.run(slotq_cmd() + ["history", "--json", *args], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    by_id = {r["run_id"]: r for r in json.loads(listed.stdout)}
    ph = live["phases"]
    assert ph["submitted"] <= ph["transferred"] <= ph["slot"] <= ph["started"] <= ph["ended"], ph
    assert 0 < live["transfer_s"] <= live["waited_s"], live
    assert attached["phases"]["transferred"] is None and attached["transfer_s"] is None, attached  # not the attach's
    for mine, theirs in ((live, by_id[live["run_id"]]), (attached, by_id[kept_id])):
        for name in record.NAMES:
            if name not in ("transfer_s", "transport"):
                got = {**theirs["phases"], "transferred": mine["phases"]["transferred"]} if name == "phases" \
                    else theirs[name]
                assert mine[name] == got, (name, mine[name], theirs[name])
