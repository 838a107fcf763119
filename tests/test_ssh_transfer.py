"""The way to a remote host (the project's sshd on 127.0.0.1): the work
tree's transfer (rsync: what is sent, each caller's tree, a tree changed
on either side, a full disk, a file gone while it is sent) and what a
stop signal or a failure on the way does (connecting, asking several
hosts, sending the tree)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import blocked_in_flock, running_with, slotq_cmd, wait_for
from remote_host import Remote, runs_in
from shared_world import USERS, World, world  # noqa: F401  (world: the fixture)
from slotq.client.ledger import Ledger


@pytest.mark.timeout(60)
def test_work_tree_transfer_respects_gitignore_and_propagates_deletes(
        remote: Remote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / ".gitignore").write_text("*.log\nbuild/\n")
    (work / "keep.txt").write_text("k")
    (work / "sub" / "deep.txt").write_text("d")
    (work / "noise.log").write_text("n")
    (work / "build").mkdir()
    (work / "build" / "out.o").write_text("o")

    def remote_files() -> list[str]:
        proc = subprocess.run(slotq_cmd() + ["run", "-q", *remote.args, "--", "find", ".", "-type", "f"],
                              capture_output=True, text=True, timeout=40, cwd=work)
        assert proc.returncode == 0, proc.stderr
        return sorted(proc.stdout.split())

    assert remote_files() == ["./.gitignore", "./keep.txt", "./sub/deep.txt"]
    (work / "keep.txt").unlink()
    assert remote_files() == ["./.gitignore", "./sub/deep.txt"]
    kinds = {w.record.kind for w in Ledger().credit(str(work), 0, time.time()).waits}
    assert kinds == {"transfer"}  # transfers always wait; these runs got the slot at once


@pytest.mark.timeout(60)
def test_each_work_dir_has_its_own_tree_on_the_host(remote: Remote, tmp_path: Path) -> None:
    # Two projects of one user, each mirrored (with --delete) to the host:
    # were they one remote tree, a run of one would delete the other's
    # files under a run of the other.
    dirs = [tmp_path / "project-a", tmp_path / "project-b"]
    for d in dirs:
        d.mkdir()
        (d / f"{d.name}.txt").write_text(d.name)

    def remote_cwd_and_files(d: Path) -> tuple[str, list[str]]:
        proc = subprocess.run(slotq_cmd() + ["run", "-q", *remote.args, "--", "sh", "-c", "pwd; ls"],
                              capture_output=True, text=True, timeout=40, cwd=d)
        assert proc.returncode == 0, proc.stderr
        cwd, *files = proc.stdout.split()
        return cwd, files

    a, b = (remote_cwd_and_files(d) for d in dirs)
    assert a[1] == ["project-a.txt"] and b[1] == ["project-b.txt"]
    assert a[0] != b[0]
    assert remote_cwd_and_files(dirs[0])[0] == a[0]  # the same dir keeps its tree (rsync sends only changes)


@pytest.mark.timeout(60)
def test_sync_none_runs_in_the_same_path(remote: Remote, tmp_path: Path) -> None:
    shared = Path("/tmp") / f"slotq-shared-{remote.tag}"
    shared.mkdir()
    shared.chmod(0o777)  # the test user's, too, whatever the suite's umask
    try:
        proc = subprocess.run(slotq_cmd() + ["run", "-q", "--sync", "none", *remote.args, "--", "pwd"],
                              capture_output=True, text=True, timeout=40, cwd=shared)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(shared)
    finally:
        shared.rmdir()


@pytest.mark.timeout(90)
def test_a_run_after_the_hosts_state_dir_was_cleaned_up_makes_its_work_dir_again(
        remote: Remote, tmp_path: Path) -> None:
    # The handshake kept for the master had made the work root; once the
    # state dir was removed on the host (a cleanup), every run over that
    # master failed "rsync exit 11" until the master closed.
    (tmp_path / "f.txt").write_text("here")
    assert runs_in(tmp_path, remote, "--", "cat", "f.txt").returncode == 0
    remote.ssh(f"rm -rf $HOME/st-{remote.tag}")
    proc = runs_in(tmp_path, remote, "--", "cat", "f.txt")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("here") and json.loads(proc.stdout[4:])["transport"]["master_reused"] is True


@pytest.mark.timeout(90)
def test_a_full_disk_on_the_host_is_unavailable_naming_the_cause(remote: Remote, tmp_path: Path) -> None:
    # rsync's last line only says "error in file IO (code 11)"; its cause
    # is on the line before. The host's state dir: a 64 KiB tmpfs of the
    # test user's (the host is this machine).
    home = remote.ssh("echo $HOME").strip()
    mnt = Path(home) / f"st-{remote.tag}"
    mnt.mkdir()
    owner = os.stat(home)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=64k,uid={owner.st_uid},gid={owner.st_gid}", "tmpfs",
                           str(mnt)], capture_output=True, text=True)
    try:
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        (tmp_path / "big.bin").write_bytes(os.urandom(256 * 1024))
        run = runs_in(tmp_path, remote, "--", "true")
        assert run.returncode == 121, run.stderr
        [line] = run.stderr.splitlines()
        assert "work tree transfer to host slotq-test failed (rsync exit 11): rsync: " in line, line
        assert "big.bin" in line and "No space left on device" in line, line
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _big_tree(tmp_path: Path) -> Path:
    """A work tree whose transfer takes a while: a 200 MB file (sparse here;
    sent in full, rsync -a has no --sparse)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    with open(tree / "aa_big.bin", "wb") as f:
        f.truncate(200 * 1024 * 1024)
    return tree


def _big_file_on_the_host(remote: Remote) -> list[Path]:
    """The big file's temporary copy on the host (this machine), while rsync sends it."""
    return list(Path(remote.ssh("echo $HOME").strip()).glob(f"st-{remote.tag}/**/.aa_big.bin.*"))


def _wait_for_the_big_file_on_its_way(remote: Remote, proc: subprocess.Popen[str]) -> None:
    home = Path(remote.ssh("echo $HOME").strip())
    wait_for(lambda: proc.poll() is not None or list(home.glob(f"st-{remote.tag}/**/.aa_big.bin.*")), timeout=60,
             interval=0.002, what="the big file's transfer under way")
    assert proc.poll() is None, proc.communicate()


@pytest.mark.timeout(60)
def test_a_stop_signal_while_connecting_is_cancelled_and_leaves_no_ssh(state_dir: Path, tmp_path: Path) -> None:
    # A host that accepts the connection and never answers (ssh waits up to
    # its ConnectTimeout, 10 s): a SIGTERM meanwhile ends the run and the
    # ssh that was connecting.
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        proc = subprocess.Popen(slotq_cmd() + ["run", "--host", "nobody@127.0.0.1", "--ssh-config", "/dev/null",
                                               "--ssh-option", f"Port={port}", "--", "true"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        conn, _ = server.accept()  # ssh is connecting (the test's timeout bounds this)
        try:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
            # (The connection still open: an ssh left would wait on.)
            left = running_with(f"Port={port}")
        finally:
            conn.close()
    finally:
        server.close()
    assert proc.returncode == 130, err
    assert "cancelled (SIGTERM) before the run reached host nobody@127.0.0.1 (connecting, or sending the work " \
        "tree); nothing ran" in err, err
    assert left == [], "the connecting ssh was left"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spread, says", [
    (["--spread", "1"], "while choosing among hosts a@127.0.0.1,b@127.0.0.1; nothing ran"),
    ([], "before the run reached host a@127.0.0.1,b@127.0.0.1 (connecting, or sending the work tree); nothing ran"),
])
def test_a_stop_signal_while_several_hosts_are_asked_is_cancelled_with_a_result(
        state_dir: Path, tmp_path: Path, spread: list[str], says: str) -> None:
    # `--host a,b --spread 1` asks each host for its status first (late
    # binding connects to each); two hosts that accept and never answer
    # keep that going (ssh's ConnectTimeout, 10 s). A SIGTERM then: slotq
    # died of it, with no result, and left the ssh.
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(20)
    port = server.getsockname()[1]
    out = tmp_path / "result.json"
    conns = []
    try:
        proc = subprocess.Popen(slotq_cmd() + ["run", "--json", str(out), "--host", "a@127.0.0.1,b@127.0.0.1",
                                               *spread, "--ssh-config", "/dev/null", "--ssh-option", f"Port={port}",
                                               "--", "true"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        conns = [server.accept()[0] for _ in range(2)]  # both hosts are being asked
        try:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
            left = running_with(f"Port={port}")
        finally:
            for conn in conns:
                conn.close()
    finally:
        server.close()
    assert proc.returncode == 130, err
    assert _waits_named(err) == [f"slotq: cancelled, waited W, ran - — cancelled (SIGTERM) {says}"], err
    assert json.loads(out.read_text())["outcome"] == "cancelled"
    assert left == [], "the hosts' ssh were left"


def _waits_named(err: str) -> list[str]:
    """stderr's lines, each wait's time as W: a run stopped before it reached
    its host still waited (submitted -> ended), a few ms or seconds."""
    import re

    return [re.sub(r"waited [0-9][0-9.]*(ms|s|m)\b", "waited W", line) for line in err.splitlines()]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_the_transfer_is_cancelled_with_a_result_and_ends_rsync(
        remote: Remote, tmp_path: Path, sig: int) -> None:
    # A harness's SIGTERM (to slotq alone) or a Ctrl-C while the work tree
    # is on its way: slotq died of it, without a word or a result, and the
    # rsync it had started went on sending.
    tree = _big_tree(tmp_path)
    proc = subprocess.Popen(slotq_cmd() + ["run", "--json", "-", *remote.args, "--", "ls"], cwd=tree,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    _wait_for_the_big_file_on_its_way(remote, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    assert proc.returncode == 130, err
    assert _waits_named(err) == [f"slotq: cancelled, waited W, ran - — cancelled ({name}) before the run reached "
                                "host slotq-test (connecting, or sending the work tree); nothing ran"], err
    assert json.loads(out)["outcome"] == "cancelled"
    assert running_with("rsync", str(tree)) == [], "rsync went on sending"
    wait_for(lambda: not _big_file_on_the_host(remote), timeout=10, what="the host's partial copy removed")


@pytest.mark.timeout(90)
def test_a_stop_signal_while_a_remote_run_starts_is_cancelled_before_it_connects(
        remote: Remote, state_dir: Path, tmp_path: Path) -> None:
    # The signal comes before the run's own handlers are set: here while
    # it records the start of its transfer in the wait ledger, held up by
    # a reader of the ledger (its spool's lock, taken by hand). slotq died
    # of it (-15), with no line and no result.
    (tmp_path / "work").mkdir()
    result = tmp_path / "r.json"
    spool_lock = os.open(str(tmp_path / "ledger.sqlite.spool.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        import fcntl

        fcntl.flock(spool_lock, fcntl.LOCK_EX)
        proc = subprocess.Popen(slotq_cmd() + ["run", "--json", str(result), *remote.args, "--", "echo", "RAN"],
                                cwd=tmp_path / "work", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        wait_for(lambda: blocked_in_flock(proc.pid), what="slotq recording its transfer's start")
        proc.send_signal(signal.SIGTERM)
    finally:
        os.close(spool_lock)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert _waits_named(err) == ["slotq: cancelled, waited W, ran - — cancelled (SIGTERM) before the run reached "
                                "host slotq-test (connecting, or sending the work tree); nothing ran"], err
    assert "RAN" not in out and json.loads(result.read_text())["outcome"] == "cancelled"
    assert remote.status()["history"] == []


@pytest.mark.timeout(90)
def test_a_file_removed_from_the_work_tree_while_it_is_sent_is_a_warning_not_unavailable(
        remote: Remote, tmp_path: Path) -> None:
    # rsync's code 24 ("some files vanished"): a build or an editor removed
    # a file while the tree was sent. The rest is there; the run goes on.
    tree = _big_tree(tmp_path)
    (tree / "zz.txt").write_text("soon gone")
    proc = subprocess.Popen(slotq_cmd() + ["run", "--json", "-", *remote.args, "--", "ls"], cwd=tree,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    _wait_for_the_big_file_on_its_way(remote, proc)  # the file list, zz.txt in it, was sent before it
    (tree / "zz.txt").unlink()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "slotq: warning: 1 file(s) vanished from the work tree while it was sent to host slotq-test" in err, err
    assert "zz.txt" in err
    listing, result = out.split("{", 1)
    assert listing.split() == ["aa_big.bin"]
    assert "vanished" in json.loads("{" + result)["transport"]["sync_warning"]


@pytest.mark.timeout(90)
def test_every_run_syncs_a_changed_tree_and_restores_what_a_command_changed_there(
        remote: Remote, tmp_path: Path) -> None:
    f = tmp_path / "f.txt"
    f.write_text("v1")
    assert runs_in(tmp_path, remote, "--", "cat", "f.txt").stdout.startswith("v1")
    f.write_text("v2")  # changed here: the next run sees it
    assert runs_in(tmp_path, remote, "--", "cat", "f.txt").stdout.startswith("v2")
    # A command changes the host's copy: the next run gets ours back.
    assert runs_in(tmp_path, remote, "--", "sh", "-c", "echo tampered > f.txt; rm -f gone").returncode == 0
    assert runs_in(tmp_path, remote, "--", "cat", "f.txt").stdout.startswith("v2")


@pytest.mark.timeout(90)
def test_a_failed_transfer_leaves_no_runner_and_no_ticket_on_the_host(remote: Remote, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # ssh, but no rsync
    bin_dir.mkdir()
    (bin_dir / "ssh").symlink_to(shutil.which("ssh") or "/usr/bin/ssh")
    (tmp_path / "work").mkdir()
    proc = runs_in(tmp_path / "work", remote, "--", "true", env=dict(os.environ, PATH=str(bin_dir)))
    res = json.loads(proc.stdout)
    assert proc.returncode == 121 and res["outcome"] == "unavailable" and "rsync is not installed" in res["message"]
    # The runner that was started during the transfer ends without joining the line.
    wait_for(lambda: not running_with(f"st-{remote.tag} slotq host run"), what="the waiting runner gone")
    shared = remote.shared()
    assert shared["waiting"] == [] and not shared["slots"][0]["held"]
    assert remote.status()["history"] == []


@pytest.mark.timeout(90)
@pytest.mark.skipif(not USERS, reason="needs the test users (scripts/test makes them)")
def test_a_file_of_the_work_tree_its_user_cannot_read_is_that_users_error_not_unavailable(
        remote: Remote, world: World) -> None:
    # A root-owned build artefact (after `sudo make`, or a container) in
    # the tree of an ordinary user: rsync cannot send it (exit 23). That is
    # the tree's fault -- the host was never at fault -- so not
    # `unavailable` (121, which a harness retries as the infrastructure's).
    user = world.a
    uid, gid = world.uid(user), pwd.getpwnam(user).pw_gid
    home = world.home(user)
    keys = home / "ssh"  # the test sshd's key and config, as this user's own (ssh insists)
    keys.mkdir()
    cfg_text = Path(remote.cfg).read_text()
    key = next(line.split()[1] for line in cfg_text.splitlines() if line.strip().startswith("IdentityFile"))
    shutil.copy(key, keys / "id")
    shutil.copy(Path(remote.cfg).parent / "known_hosts", keys / "known_hosts")
    (keys / "config").write_text(cfg_text.replace(key, str(keys / "id")).replace(
        str(Path(remote.cfg).parent / "known_hosts"), str(keys / "known_hosts")))
    # Short, under /tmp whatever $TMPDIR says: a socket's path must fit in
    # 107 bytes, or slotq falls back to /tmp/slotq-ssh-<uid>, outside this
    # test's dirs. Removed at the end, with the master in it.
    runtime = Path(tempfile.mkdtemp(prefix="sq-", dir="/tmp"))
    work = home / "work"
    (work / "build").mkdir(parents=True)
    (work / "main.py").write_text("print('hi')\n")
    (work / "build" / "artefact.o").write_text("root's")  # stays root's, 0600
    os.chmod(work / "build" / "artefact.o", 0o600)
    for p in [keys, *keys.iterdir(), runtime, work, work / "main.py", work / "build"]:
        os.chown(p, uid, gid)
        if p.parent == keys:
            os.chmod(p, 0o600)
    args = ["--host", "slotq-test", "--ssh-config", str(keys / "config"), "--remote-slotq", remote.remote_slotq]
    try:
        proc = subprocess.run(world.cmd("run", "--json", str(home / "r.json"), *args, "--", "echo", "RAN"),
                              capture_output=True, text=True, timeout=60, cwd=work, stdin=subprocess.DEVNULL,
                              env=world.env(user, XDG_RUNTIME_DIR=str(runtime)), user=uid, group=gid)
    finally:
        socks = runtime / "slotq-ssh"
        for sock in socks.iterdir() if socks.is_dir() else []:
            if sock.is_socket():
                subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=20)
        shutil.rmtree(runtime)
    assert proc.returncode == 66, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("slotq run: error: cannot read 1 path(s) of "
                                                                   f"the work tree {work} to send it to host "
                                                                   "slotq-test: "), proc.stderr
    assert f'"{work}/build/artefact.o": Permission denied' in proc.stderr and "nothing ran" in proc.stderr
    assert "RAN" not in proc.stdout and not (home / "r.json").exists()
    assert remote.status()["history"] == []
