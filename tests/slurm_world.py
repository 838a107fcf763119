"""The Slurm tests' world: the private cluster scripts/test starts
(scripts/slurm-test-cluster), a fixture `slurm_env` that points a test at
it with a state dir of its own (conftest.py makes it everyone's), and the
helpers that start runs, hold the node and read what Slurm says."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import slotq_cmd, wait_for

CONF = os.environ.get("SLOTQ_TEST_SLURM_CONF", "")
# For the Slurm test files: `pytestmark = requires_cluster`.
requires_cluster = pytest.mark.skipif(not CONF or not Path(CONF).exists(),
                                      reason="no test Slurm cluster (scripts/test starts one as root)")
MAGIC_LOOKALIKE = b"\x00SLOTQ-STREAM 2\nV\x00\x00\x00\x1c{\"event\":\"exited\",\"at\":1}\n"


def squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, errors="replace", timeout=30,
                          env=dict(os.environ, SLURM_CONF=CONF)).stdout


def jobs_named(name: str) -> str:
    """Slurm's jobs with this name (pending, running or completing)."""
    return squeue("--name", name, "-t", "PD,R,CG,CF", "-o", "%i %T")


@pytest.fixture
def slurm_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """SLURM_CONF for the test cluster, a private state dir, ledger and
    config; every job a test submitted is cancelled afterwards."""
    monkeypatch.setenv("SLURM_CONF", CONF)
    monkeypatch.setenv("SLOTQ_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLOTQ_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.delenv("SLOTQ_CONFIG", raising=False)
    monkeypatch.delenv("SLOTQ_BACKEND", raising=False)
    yield tmp_path
    mine = tmp_path.name  # placeholders are named after the test's dir
    for line in squeue("-o", "%i|%j").splitlines():
        job, _, name = line.partition("|")
        if name.startswith("slotq-") or mine in name:
            subprocess.run(["scancel", job], env=dict(os.environ, SLURM_CONF=CONF), timeout=30)


def placeholder(tmp: Path, seconds: int, partition: str = "test", suffix: bytes = b"") -> str:
    """A job that holds the node's two CPUs for `seconds`; its id once it runs."""
    name = os.fsencode(f"placeholder-{tmp.name}") + suffix
    proc = subprocess.run(["sbatch", "--parsable", "-p", partition, "-c2", "-o", "/dev/null", "-J", name,
                           "--time=2", "--wrap", f"sleep {seconds}"], capture_output=True, text=True,
                          timeout=30, env=dict(os.environ, SLURM_CONF=CONF))
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    wait_for(lambda: "RUNNING" in squeue("-j", job, "-o", "%T"), timeout=20, what="the placeholder running")
    return job


def start(tmp: Path, name: str, *args: str, session: bool = True) -> subprocess.Popen[bytes]:
    """`slotq run --slurm` in a process group of its own (as a harness
    starts a job), output to files."""
    return subprocess.Popen(slotq_cmd() + ["run", "--slurm", "--json", str(tmp / f"{name}.json"), *args],
                            stdin=subprocess.DEVNULL, stdout=open(tmp / f"{name}.out", "wb"),
                            stderr=open(tmp / f"{name}.err", "wb"), cwd=tmp, start_new_session=session)


def result(tmp: Path, name: str) -> dict[str, Any]:
    return dict(json.loads((tmp / f"{name}.json").read_text()))


def err(tmp: Path, name: str) -> str:
    return (tmp / f"{name}.err").read_text(errors="replace")


def pending_job(tmp: Path, name: str) -> str:
    """The Slurm job of a waiting run, from its status line."""
    found = wait_for(lambda: re.search(r"Slurm job (\d+), reason", err(tmp, name)), timeout=20,
                     what="a status line naming the pending job")
    return str(found.group(1))


def history_lines(run_id: str) -> list[dict[str, Any]]:
    """The run's records in `slotq history` (of the test's state dir)."""
    proc = subprocess.run(slotq_cmd() + ["history", "--json", "--since", "1h"], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return [dict(r) for r in json.loads(proc.stdout) if r["run_id"] == run_id]


def history_line(run_id: str) -> dict[str, Any]:
    """The run's one record in `slotq history`."""
    [line] = history_lines(run_id)
    return line


def pending_run(tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    """A run of `true` waiting in Slurm's line behind a placeholder that
    holds the node for 30 s: its caller, and its pending job."""
    placeholder(tmp, 30)
    caller = start(tmp, name, "--report-every", "1", "--", "true")
    return caller, pending_job(tmp, name)
