"""Chaos in the suite: 60 callers, a fifth of them SIGKILLed at random
moments in three styles (caller pid, caller process group, supervisor
only), some commands hung. The queue must keep every promise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos import run_chaos


def every_promise_kept(report: dict[str, Any]) -> None:
    """No overlap, FIFO, survivors as expected, nothing stale or orphaned,
    no slot held past its limit, every killed run in the history."""
    assert report["overlaps"] == [], json.dumps(report)
    assert report["fifo_inversions"] == 0, json.dumps(report)
    assert report["survivors_not_as_expected"] == {}, json.dumps(report)
    assert report["stale_tickets"] == [], json.dumps(report)
    assert report["orphan_groups"] == [], json.dumps(report)
    assert max(report["longest_hold_s"].values()) <= report["hold_limit_s"], json.dumps(report)
    assert report["killed_without_history"] == [], json.dumps(report)


@pytest.mark.timeout(150)
def test_sixty_callers_with_random_sigkills_keep_every_promise(tmp_path: Path) -> None:
    report = run_chaos(tmp_path, callers=60, timeout=120, seed=11)  # 15 kills planned
    assert sum(report["killed"].values()) >= 12, json.dumps(report)  # the chaos happened (15 planned)
    every_promise_kept(report)


@pytest.mark.timeout(150)
def test_callers_waiting_away_with_random_sigkills_keep_every_promise(tmp_path: Path) -> None:
    # The same chaos in a slow one-slot pool: far-back quiet runs wait away
    # (a shell and flock), come back, or are killed there in every style
    # (`keeper`: one of their flocks).
    report = run_chaos(tmp_path, callers=40, timeout=120, seed=5, slow=True, landing_share=0.8, kill_share=0.3)
    assert report["went_away"] >= 10 and report["killed_away"], json.dumps(report)
    every_promise_kept(report)
