"""The wait ledger and `slotq task` end to end, with real processes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from conftest import Run, slotq_cmd, wait_for
from slotq.slot import read_slot

Start = Callable[..., Run]


def hold_shared_slot(runs: Start, state_dir: Path, seconds: int = 6) -> Run:
    h = runs("--label", "placeholder", "--", "sleep", str(seconds), name="holder")
    wait_for(lambda: (read_slot(str(state_dir), "shared", 0)[1] or {}).get("phase") == "running",
             what="placeholder holds the slot")
    return h


def task(tmp_path: Path, *args: str, timeout: float = 40) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    out = tmp_path / f"task{time.monotonic_ns()}.json"
    proc = subprocess.run(slotq_cmd() + ["task", "--json", str(out), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)
    return proc, json.loads(out.read_text())


@pytest.mark.timeout(60)
def test_task_outlives_its_budget_while_its_inner_run_waits_and_passes(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    hold_shared_slot(runs, state_dir)
    proc, res = task(tmp_path, "--budget", "3s", "--recheck", "1s", "--credit-dir", str(tmp_path), "--",
                     *slotq_cmd(), "run", "--budget", "1", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert res["outcome"] == "passed"
    assert res["elapsed_s"] > 3.5  # it outlived its 3 s budget: the wait was in progress


@pytest.mark.timeout(60)
def test_task_is_extended_by_the_wait_once_it_ends(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    hold_shared_slot(runs, state_dir)
    # The inner run waits ~6 s, then works 2 s: the check after its wait
    # ended credits the wait, and the budget (3 s + ~6 s) covers the work.
    proc, res = task(tmp_path, "--budget", "3s", "--recheck", "0.5s", "--credit-dir", str(tmp_path), "--",
                     *slotq_cmd(), "run", "--budget", "5", "--", "sleep", "2")
    assert proc.returncode == 0, proc.stderr
    assert res["outcome"] == "passed"
    assert len(res["extensions"]) == 1
    assert 4.0 <= res["credited_s"] <= 7.0
    assert "budget extended by" in proc.stderr
    assert res["elapsed_s"] > 7


@pytest.mark.timeout(60)
def test_a_delivery_deadline_ends_the_task_at_its_time(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    hold_shared_slot(runs, state_dir)
    proc, res = task(tmp_path, "--budget", "3s", "--deadline", "3s", "--recheck", "1s", "--kill-grace", "1",
                     "--credit-dir", str(tmp_path), "--", *slotq_cmd(), "run", "--budget", "1", "--", "true")
    assert proc.returncode == 118
    assert res["outcome"] == "deadline" and res["blame"] == "task"
    assert 2.9 <= res["elapsed_s"] < 5.5


@pytest.mark.timeout(30)
def test_a_task_with_nothing_to_credit_ends_budget_exhausted(state_dir: Path, tmp_path: Path) -> None:
    proc, res = task(tmp_path, "--budget", "1s", "--kill-grace", "1", "--", "sleep", "30")
    assert proc.returncode == 119
    assert res["outcome"] == "budget_exhausted" and res["extensions"] == []
    assert res["elapsed_s"] < 5


def test_a_task_passes_the_commands_own_exit_code_and_stdio(state_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(slotq_cmd() + ["task", "-q", "--budget", "10s", "--", "sh", "-c", "cat; exit 4"],
                          input="piped", capture_output=True, text=True, timeout=20)
    assert proc.returncode == 4 and proc.stdout == "piped"


@pytest.mark.timeout(30)
def test_waits_shows_what_a_dir_waited(state_dir: Path, runs: Start, tmp_path: Path) -> None:
    hold_shared_slot(runs, state_dir, seconds=2)
    q = runs("--", "true", name="queued")
    assert q.wait() == 0
    proc = subprocess.run(slotq_cmd() + ["waits", "--json", "--dir", str(tmp_path), "--since", "5m"],
                          capture_output=True, text=True, timeout=20)
    data = json.loads(proc.stdout)
    waited = [w for w in data["waits"] if w["run_id"] == q.result()["run_id"]]
    assert len(waited) == 1 and waited[0]["kind"] == "queue" and waited[0]["seconds"] >= 1.0
    assert waited[0]["seconds"] == pytest.approx(q.result()["waited_s"], abs=0.5)
    text = subprocess.run(slotq_cmd() + ["waits", "--dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=20).stdout
    assert "total: sum" in text and "queue" in text


@pytest.mark.timeout(30)
def test_an_unwritable_ledger_costs_one_warning_and_the_run_passes(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SLOTQ_LEDGER", str(blocker / "ledger.sqlite"))
    hold_shared_slot(runs, state_dir, seconds=1)  # so that the run waits, and records it
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--report-every", "0.2", "--", "echo", "ok"],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0 and proc.stdout == "ok\n"
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "wait ledger" in warnings[0]


@pytest.mark.parametrize("args,needle", [
    (["task", "--", "true"], "--budget"),
    (["task", "--budget", "soon", "--", "true"], "cannot read 'soon'"),
    (["task", "--budget", "5", "--credit", "max", "--", "true"], "'max' is not one of union, sum"),
    (["task", "--budget", "5"], "no command given"),
    (["waits", "--since", "yesterday"], "cannot read 'yesterday'"),
    (["task", "--budget", "5", "--json", "/nonexistent-dir/r.json", "--", "true"], "cannot write --json file"),
    (["run", "--json", "/nonexistent-dir/r.json", "--", "true"], "cannot write --json file"),
])
def test_bad_task_and_waits_arguments_are_one_line_exit_2(state_dir: Path, args: list[str], needle: str) -> None:
    proc = subprocess.run(slotq_cmd() + args, capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_an_uncontended_run_costs_no_ledger_write(state_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.run(slotq_cmd() + ["run", "-q", "--", "true"], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0
    assert not (tmp_path / "ledger.sqlite").exists()  # it got its slot at once: nothing was waited
