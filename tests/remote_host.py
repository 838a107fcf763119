"""The remote host of the ssh tests: the project's sshd on 127.0.0.1
(scripts/sshd-test-server) as the session fixture `ssh_config`, and a
test's view of the host (`Remote`, fixture `remote`), each test with a
state dir of its own there. conftest.py makes the fixtures everyone's."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import slotq_cmd

ROOT = Path(__file__).resolve().parent.parent

REMOTE_MEMBERS = ("python3 -c 'import os,sys\n"
                  "n=0\n"
                  "for d in os.listdir(\"/proc\"):\n"
                  "    try: f=open(\"/proc/\"+d+\"/stat\",\"rb\").read().rsplit(b\")\",1)[1].split()\n"
                  "    except Exception: continue\n"
                  "    n+= f[0]!=b\"Z\" and int(f[2])==int(sys.argv[1])\n"
                  "print(n)' ")


@pytest.fixture(scope="session")
def ssh_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test sshd: the one scripts/test started, else start our own."""
    cfg = os.environ.get("SLOTQ_TEST_SSH_CONFIG")
    if cfg and os.path.exists(cfg):
        yield cfg
        return
    d = tmp_path_factory.mktemp("sshd")
    proc = subprocess.run([str(ROOT / "scripts" / "sshd-test-server"), "start", str(d)], capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot start the test sshd: {proc.stderr[-2000:]}")
        pytest.skip(f"no test sshd (needs root and Debian packages): {proc.stderr.strip()[-300:]}")
    try:
        yield str(d / "ssh_config")
    finally:
        subprocess.run([str(ROOT / "scripts" / "sshd-test-server"), "stop", str(d)], timeout=60)


class Remote:
    """One test's view of the remote host, with a state dir of its own."""

    def __init__(self, cfg: str, host: str = "slotq-test") -> None:
        self.cfg = cfg
        self.host = host
        self.tag = uuid.uuid4().hex[:10]
        self.remote_slotq = f"SLOTQ_STATE_DIR=$HOME/st-{self.tag} slotq"
        self.args = ["--host", host, "--ssh-config", cfg, "--remote-slotq", self.remote_slotq]

    def ssh(self, command: str, timeout: float = 20) -> str:
        proc = subprocess.run(["ssh", "-F", self.cfg, self.host, command], capture_output=True, text=True,
                              timeout=timeout)
        return proc.stdout

    def status(self) -> dict[str, Any]:
        proc = subprocess.run(slotq_cmd() + ["status", "--json", *self.args], capture_output=True, text=True,
                              timeout=20)
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))

    def shared(self) -> dict[str, Any]:
        return next(p for p in self.status()["pools"] if p["pool"] == "shared")

    def holder_running(self) -> bool:
        slot = self.shared()["slots"][0]
        return bool(slot["held"] and slot.get("phase") == "running")

    def group_members(self, pgid: int) -> int:
        """Live members of process group `pgid` on the host; fails the test
        if it cannot look (never a 0 that means 'could not tell')."""
        out = self.ssh(REMOTE_MEMBERS + str(pgid)).strip()
        assert out.isdigit(), f"cannot count the remote process group {pgid}: {out!r}"
        return int(out)

    def gate(self) -> str:
        return f"/tmp/slotq-gate-{self.tag}"

    def cleanup(self) -> None:
        """Open the gate for any holder still polling it, then leave nothing
        on the host: gate, pid file, this test's state dir."""
        self.ssh(f"touch {self.gate()}; rm -rf {self.gate()} /tmp/slotq-pg-{self.tag} \"$HOME/st-{self.tag}\"")

    def gate_cmd(self) -> list[str]:
        return ["sh", "-c", f'while [ ! -e {self.gate()} ]; do sleep 0.01; done']


@pytest.fixture
def remote(ssh_config: str, state_dir: Path) -> Iterator[Remote]:
    r = Remote(ssh_config)
    yield r
    # The runs are ended by now (the `runs` fixture, torn down first); open
    # the gate for any remote holder still polling it, then leave nothing.
    r.cleanup()


def runs_in(tmp: Path, remote: Remote, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """`slotq run -q --json - ARGS` on the remote host from work tree `tmp`."""
    return subprocess.run(slotq_cmd() + ["run", "-q", "--json", "-", *remote.args, *args], capture_output=True,
                          text=True, timeout=60, cwd=tmp, env=env, stdin=subprocess.DEVNULL)

