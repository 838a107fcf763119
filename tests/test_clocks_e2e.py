"""Each clock on every path (issue 66): a run behind a holder waits longer
than its budget and its no-output watchdog, and then

- a command that prints within --idle and ends within --budget passes;
- a command that runs past --budget ends exec_timeout after the budget,
  counted from the command's start (not the submission, not the slot);
- a command that goes silent ends idle_timeout after --idle, counted from
  the command's start.

The paths: this machine's one-slot line (a standby keeper starts the
command), a two-slot pool (the runner's lease), a prepare step first, a
kept run (its stand-in keeps the clocks; the result taken by attach), a
remote host over ssh, and Slurm. The backstop (budget + 90 s from the
slot) is the one clock a real run cannot show in a test's time: its rule
is Watchdogs', which the caller and a kept run's stand-in both follow
(tests/test_logic.py drives it on a fake clock)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import Run, Start, slotq_cmd, wait_for

HOLD_S = 3  # the holder's time: longer than any budget or --idle below
CASES = [  # (name, options, outcome, exit code)
    ("in_time", ["--budget", "2s", "--idle", "1s", "--", "sh", "-c", "echo a; sleep 0.5; echo b; sleep 0.5; echo c"],
     "passed", 0),
    ("too_long", ["--budget", "1s", "--kill-grace", "1s", "--", "sleep", "30"], "exec_timeout", 124),
    ("silent", ["--idle", "1s", "--budget", "30s", "--kill-grace", "1s", "--", "sh", "-c", "echo a; sleep 30"],
     "idle_timeout", 123),
]
Finish = Callable[[], tuple[int, dict[str, Any]]]


def judge(finished: list[tuple[int, dict[str, Any]]]) -> None:
    for (name, _, outcome, code), (got, record) in zip(CASES, finished):
        assert (record["outcome"], got) == (outcome, code), (name, record["message"])
        assert record["waited_s"] >= HOLD_S - 0.5, (name, record["waited_s"])  # it waited past every clock
        assert record["phases"]["started"] is not None, name
        if name != "in_time":  # ended by its clock, counted from the command's start
            assert 0.9 <= record["ran_s"] <= 4.0, (name, record["ran_s"])


def local_runs(runs: Start, extra: list[str]) -> list[Finish]:
    started = [runs(*extra, *args, name=name) for name, args, _, _ in CASES]

    def finish(r: Run) -> Finish:
        return lambda: (r.wait(60), r.result())

    return [finish(r) for r in started]


def holding(state_dir: Path, runs: Start, slots: int = 1) -> None:
    for i in range(slots):
        runs("-q", "--", "sleep", str(HOLD_S), name=f"holder{i}")
    wait_for(lambda: len([s for s in slot_holders(state_dir) if s.get("phase") == "running"]) == slots,
             what="the holders running")


def slot_holders(state_dir: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(slotq_cmd() + ["status", "--json"], capture_output=True, text=True, timeout=20)
    pool = next(p for p in json.loads(proc.stdout)["pools"] if p["pool"] == "shared")
    return [s for s in pool["slots"] if s.get("held")]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("path", ["one_slot", "two_slots", "prepare"])
def test_each_clock_starts_with_the_command_on_this_machine(state_dir: Path, runs: Start, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    slots = 2 if path == "two_slots" else 1
    config = tmp_path / "host.toml"
    config.write_text(f"[pools]\nshared = {slots}\nlanding = 1\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(config))
    holding(state_dir, runs, slots)
    judge([f() for f in local_runs(runs, ["--prepare", "sleep 1"] if path == "prepare" else [])])


@pytest.mark.timeout(90)
def test_each_clock_starts_with_the_command_of_a_kept_run(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # The stand-in keeps them: it counted --idle while in line (a mutant the
    # suite let pass), and a `--detach --idle 1s` run behind a holder ended.
    holding(state_dir, runs)
    ids = []
    for _, args, _, _ in CASES:
        left = subprocess.run(slotq_cmd() + ["run", "--detach", *args], capture_output=True, text=True, timeout=30,
                              cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert left.returncode == 0, left.stderr
        ids.append(left.stdout.strip())

    def attach(run_id: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run(slotq_cmd() + ["attach", run_id, "--json", "-"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        return done.returncode, json.loads(done.stdout.splitlines()[-1])

    judge([attach(i) for i in ids])


@pytest.mark.timeout(120)
def test_each_clock_starts_with_the_command_on_a_remote_host(remote: Any, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()

    def start(name: str, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(slotq_cmd() + ["run", "-q", "--json", str(tmp_path / f"{name}.json"), *remote.args,
                                               *args], cwd=work, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.err", "wb"))

    holder = start("holder", "--", "sleep", str(HOLD_S))
    wait_for(remote.holder_running, timeout=30, what="the remote holder running")
    procs = [start(name, *args) for name, args, _, _ in CASES]
    finished = []
    for (name, _, _, _), proc in zip(CASES, procs):
        code = proc.wait(timeout=60)
        finished.append((code, json.loads((tmp_path / f"{name}.json").read_text())))
    assert holder.wait(timeout=30) == 0
    judge(finished)


@pytest.mark.timeout(150)
def test_each_clock_starts_with_the_command_under_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_world import CONF, placeholder, result, start

    if not CONF or not Path(CONF).exists():
        pytest.skip("no test Slurm cluster (SLOTQ_TEST_SLURM_CONF)")
    import os

    monkeypatch.setenv("SLURM_CONF", CONF)
    monkeypatch.setenv("SLOTQ_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLOTQ_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.delenv("SLOTQ_CONFIG", raising=False)
    job = placeholder(tmp_path, HOLD_S + 1)
    try:
        procs = [start(tmp_path, name, *args) for name, args, _, _ in CASES]
        finished = [(p.wait(timeout=90), result(tmp_path, name)) for (name, _, _, _), p in zip(CASES, procs)]
    finally:
        subprocess.run(["scancel", job], env=dict(os.environ, SLURM_CONF=CONF), timeout=30)
    judge(finished)
