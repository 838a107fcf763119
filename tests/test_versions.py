"""Upgrades while people wait (docs/operating.md, "Upgrades"): this
release's slotq shares a pool with the previous release's -- FIFO, never
two commands in one slot, each side's outcomes right -- and each reaches
the other over ssh, both ways. A host speaking no protocol in common is
refused before anything queues, in one line naming both versions and the
upgrade.

The previous release is installed from git: the tree at its last commit,
`git archive`d from this clone (a shallow clone may lack it: then these
tests are skipped, saying so)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from conftest import live_tickets, slotq_cmd, start_holder, wait_for
from remote_host import Remote

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
# slotq 0.1.0: the last commit before 0.2.0's changes (CHANGELOG.md).
PREVIOUS = ("0.1.0", "f1670525214b9546f2bbc65c17c9fe751d2fc713")


@pytest.fixture(scope="module")
def previous() -> Iterator[Path]:
    """The previous release's package, from git, in a directory every user
    can read (the ssh test user runs it too): its `src`."""
    version, commit = PREVIOUS
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                                                     capture_output=True, timeout=30).returncode != 0:
        pytest.skip(f"slotq {version} ({commit[:12]}) is not in this clone (a shallow one?): git fetch --unshallow")
    top = Path(tempfile.mkdtemp(prefix="slotq-previous-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src/slotq"], capture_output=True,
                                 timeout=60, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(top)], input=archive, check=True, timeout=60)
        for d, _, files in os.walk(top):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        src = top / "src"
        said = subprocess.run([sys.executable, "-c", "import slotq; print(slotq.__version__)"], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=str(src)), timeout=30)
        assert said.stdout.strip() == version, said.stderr
        yield src
    finally:
        shutil.rmtree(top, ignore_errors=True)


def old_cmd(src: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-m", "slotq", *args], dict(os.environ, PYTHONPATH=str(src))


def popen(argv: list[str], env: dict[str, str] | None, tmp: Path, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(tmp / f"{name}.err", "wb"))


def test_a_pool_shared_by_this_release_and_the_previous_keeps_fifo_one_at_a_time_and_each_ones_outcome(
        previous: Path, state_dir: Path, runs: object, tmp_path: Path) -> None:
    gate, log = tmp_path / "gate", tmp_path / "log"
    start_holder(runs, state_dir, gate)  # type: ignore[arg-type]
    procs = []
    for i in range(6):
        old = i % 2 == 0
        code = 3 if i in (2, 3) else 0  # one failure on each side
        script = f"echo start{i} >> {log}; sleep 0.05; echo end{i} >> {log}; exit {code}"
        args = ["run", "--json", str(tmp_path / f"w{i}.json"), "--", "sh", "-c", script]
        argv, env = old_cmd(previous, *args) if old else (slotq_cmd() + args, None)
        procs.append(popen(argv, env, tmp_path, f"w{i}"))
        wait_for(lambda: len(live_tickets(state_dir)) == i + 1, what=f"w{i} ({'0.1.0' if old else '0.2.0'}) in line")
    gate.touch()
    codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0, 0, 3, 3, 0, 0], [(tmp_path / f"w{i}.err").read_text() for i in range(6)]
    # In ticket order, and never two at once: each one's end before the next one's start.
    assert log.read_text().split() == [f"{w}{i}" for i in range(6) for w in ("start", "end")]
    for i in range(6):
        rec = json.loads((tmp_path / f"w{i}.json").read_text())
        assert rec["outcome"] == ("failed" if i in (2, 3) else "passed"), rec
        assert rec["exit_code"] == (3 if i in (2, 3) else 0) or rec.get("command_exit_code") == 3, rec
    seen = subprocess.run(slotq_cmd() + ["history", "--json", "--since", "1h"], capture_output=True, text=True,
                          timeout=30)
    outcomes = sorted(r["outcome"] for r in json.loads(seen.stdout) if r.get("label") != "placeholder")
    assert outcomes == ["failed", "failed", "passed", "passed", "passed", "passed"], "both sides' history lines"


def remote_previous(remote: Remote, previous: Path) -> str:
    """The previous release as the ssh test user runs it, in this test's state dir there."""
    python = os.path.join(os.environ["SLOTQ_TEST_SSH_USER_HOME"], "venv", "bin", "python")
    return f"SLOTQ_STATE_DIR=$HOME/st-{remote.tag} PYTHONPATH={previous} {python} -m slotq"


def test_this_release_runs_on_a_host_of_the_previous_one_over_ssh(previous: Path, remote: Remote,
                                                                  tmp_path: Path) -> None:
    if not os.environ.get("SLOTQ_TEST_SSH_USER_HOME"):
        pytest.skip("needs the ssh test user (scripts/test)")
    args = ["--host", remote.host, "--ssh-config", remote.cfg, "--remote-slotq", remote_previous(remote, previous)]
    for script, code, outcome in (("echo hi", 0, "passed"), ("exit 3", 3, "failed")):
        done = subprocess.run(slotq_cmd() + ["run", "--json", "-", *args, "--", "sh", "-c", script],
                              capture_output=True, text=True, timeout=90, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert done.returncode == code, done.stderr
        rec = json.loads(done.stdout.splitlines()[-1])
        assert rec["outcome"] == outcome and rec["transport"]["remote_slotq"] == "0.1.0", rec


def test_the_previous_release_runs_on_a_host_of_this_one_over_ssh(previous: Path, remote: Remote,
                                                                  tmp_path: Path) -> None:
    for script, code, word in (("echo hi", 0, "passed"), ("exit 3", 3, "failed")):
        argv, env = old_cmd(previous, "run", *remote.args, "--", "sh", "-c", script)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90, cwd=tmp_path,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == code, done.stderr
        assert f"slotq: {word}" in done.stderr, done.stderr


def test_a_host_speaking_no_protocol_in_common_is_refused_before_anything_queues(remote: Remote,
                                                                                tmp_path: Path) -> None:
    # A host whose `slotq host hello` says an older stream protocol only.
    hello = json.dumps({"slotq": "0.0.9", "protocol": 3, "host": "h", "state_dir": "/nowhere", "work_root": "/tmp"})
    fake = f"printf '%s\\n' '{hello}' #"
    done = subprocess.run(slotq_cmd() + ["run", "--host", remote.host, "--ssh-config", remote.cfg,
                                         "--remote-slotq", fake, "--", "true"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 121, done.stderr
    line = [x for x in done.stderr.splitlines() if "stream protocols" in x]
    assert len(line) == 1, done.stderr
    assert "runs slotq 0.0.9 (stream protocols 3-3); this slotq 0.2.0 speaks stream protocols 4-5" in line[0]
    assert "upgrade the older slotq (pip install -U slotq)" in line[0]
