"""`slotq host check` (cli/hostcheck.py): one line per finding, each
problem with its fix; exit 0 only when all is well. Driven against real
state dirs, a real shared one made by `host init`, the project's test sshd
and its Slurm cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import slotq_cmd
from remote_host import Remote
from shared_world import SKIP_WHY, USERS, World, world  # noqa: F401 (world: a fixture)
from slurm_world import requires_cluster

pytestmark = pytest.mark.timeout(90)


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + ["host", "check", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env=env)


def config_says(monkeypatch: pytest.MonkeyPatch, path: Path, text: str) -> None:
    """`path` holds the host config `text`, and is $SLOTQ_CONFIG."""
    path.write_text(text)
    monkeypatch.setenv("SLOTQ_CONFIG", str(path))


def fixes(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("FIX  ")]


def test_a_host_in_order_passes_every_check_in_one_line_each(state_dir: Path, tmp_path: Path) -> None:
    assert subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, timeout=30).returncode == 0
    done = check()
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert all(line.startswith("ok   ") for line in lines), lines
    assert lines[0].startswith("ok   slotq 0.2.0 (") and "stream protocols 4-5" in lines[0]
    assert f"ok   state dir {state_dir}: owner root" in done.stdout and "state layout 1" in done.stdout
    assert "disk of" in done.stdout and "inotify max_user_instances" in done.stdout


def test_a_bad_config_and_a_newer_layout_each_say_their_fix_and_fail_the_check(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, timeout=30).returncode == 0
    (state_dir / "layout").write_text("9\n")
    refused = subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], cwd=tmp_path, timeout=30,
                             capture_output=True, text=True)
    assert refused.returncode == 73 and refused.stderr.count("\n") == 1, refused.stderr
    assert "has layout 9, newer than this slotq 0.2.0 knows (1): upgrade slotq" in refused.stderr
    bad = tmp_path / "host.toml"
    config_says(monkeypatch, bad, "[pools]\nshared = 'many'\n")
    done = check()
    assert done.returncode == 1
    found = fixes(done.stdout)
    assert any(f.startswith("FIX  host config:") and f"edit {bad}" in f for f in found), found
    assert any("state layout 9 is newer than this slotq knows (1): pip install -U slotq" in f for f in found), found


@pytest.mark.skipif(os.getuid() != 0 or len(USERS) < 2, reason=SKIP_WHY)
def test_on_a_shared_host_a_members_drain_file_and_a_dir_not_made_by_init_are_named(world: World) -> None:
    env = dict(os.environ, SLOTQ_STATE_DIR=str(world.state))
    ok = check(env=env)
    assert ok.returncode == 0, ok.stdout
    assert "shared by its group, sticky" in ok.stdout and "ok   state layout 1" in ok.stdout
    planted = world.py(world.a, f"open({str(world.state / 'drain.shared')!r}, 'w').write('{{}}')")
    assert planted.returncode == 0, planted.stderr
    os.chmod(world.state / "slots", 0o777)  # writable by all, and not sticky
    done = check(env=env)
    assert done.returncode == 1
    found = fixes(done.stdout)
    assert any(f"is user {world.a}'s, not the owner's" in f and "rm " in f for f in found), found
    assert any("not sticky" in f and f"slotq host init --shared {world.state}" in f for f in found), found


def test_the_ssh_hosts_the_config_names_are_reached_or_said_unreachable(
        remote: Remote, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_says(monkeypatch, tmp_path / "host.toml",
                '[pools]\nshared = 1\nlanding = 1\n\n[groups]\nci = ["slotq-test", "slotq-nowhere"]\n')
    ssh_config = tmp_path / "ssh_config"
    # A host on loopback where nothing listens (port 1).
    ssh_config.write_text(Path(remote.cfg).read_text()
                          + "\nHost slotq-nowhere\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 5\n")
    done = check("--ssh-config", str(ssh_config), "--remote-slotq", remote.remote_slotq)
    assert done.returncode == 1, done.stdout
    assert "ok   host slotq-test ([groups]) answers: slotq 0.2.0, stream protocols 4-5" in done.stdout
    [nowhere] = [f for f in fixes(done.stdout) if "slotq-nowhere" in f]
    assert "host slotq-nowhere ([groups]):" in nowhere and "check `ssh HOST slotq host hello`" in nowhere


@requires_cluster
def test_slurm_is_reached_and_a_partition_it_lacks_is_named(slurm_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = check()
    assert done.returncode == 0, done.stdout
    assert "ok   Slurm answers: partitions" in done.stdout
    config_says(monkeypatch, slurm_env / "host.toml",
                '[pools]\nshared = 1\nlanding = 1\n\n[slurm.classes]\nshared = { partition = "nosuch" }\n')
    done = check()
    assert done.returncode == 1
    assert any("partition(s) nosuch, which sinfo does not list" in f for f in fixes(done.stdout)), done.stdout
