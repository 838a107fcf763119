"""The chaos scenario (slotq alone): tests/chaos.py run a few times, the
worst figure of each kind kept."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tools import remove_work

HERE = Path(__file__).resolve().parent


def chaos(callers: int, reps: int) -> dict[str, object]:
    """Run tests/chaos.py `reps` times; the worst figure of each kind."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from chaos import run_chaos  # type: ignore[import-not-found]  # tests/, on sys.path from here

    runs = []
    for seed in range(reps):
        work = Path(tempfile.mkdtemp(prefix="slotq-bench-chaos-"))
        try:
            r = run_chaos(work, callers, seed=seed, spacing=0.02, timeout=900)
        finally:
            remove_work(work)
        print(f"chaos seed {seed}: {json.dumps(r)}", file=sys.stderr)
        runs.append(r)
    holds: dict[str, float] = {}
    for r in runs:
        for style, s in r["longest_hold_s"].items():
            holds[style] = max(holds.get(style, 0.0), s)
    killed = {s: sum(r["killed"][s] for r in runs) for s in ("pid", "group", "keeper")}
    return {"runs": reps, "callers": callers, "killed": killed,
            "overlaps": sum(len(r["overlaps"]) for r in runs),
            "fifo_inversions": sum(r["fifo_inversions"] for r in runs),
            "survivors": sum(r["survivors"] for r in runs),
            "survivors_not_as_expected": sum(len(r["survivors_not_as_expected"]) for r in runs),
            "stale_tickets": sum(len(r["stale_tickets"]) for r in runs),
            "orphan_groups": sum(len(r["orphan_groups"]) for r in runs),
            "killed_without_history": sum(len(r["killed_without_history"]) for r in runs),
            "longest_hold_s": holds, "hold_limit_s": runs[0]["hold_limit_s"],
            "elapsed_s": [r["elapsed_s"] for r in runs]}


def format_chaos(c: dict[str, object]) -> list[str]:
    k = c["killed"]
    h = c["longest_hold_s"]
    assert isinstance(k, dict) and isinstance(h, dict)
    return [f"chaos (slotq): {c['runs']} runs x {c['callers']} callers, shared = 2 + landing = 1, "
            f"budget 2 s, kill-grace 0.5 s; killed: {k['pid']} by pid, {k['group']} by process group, "
            f"{k['keeper']} supervisor only",
            "| overlaps | FIFO violations | survivors not as expected | stale tickets | orphans 5 s after | "
            "killed runs without history | longest hold: not killed / pid / group / supervisor (limit) |",
            "|---|---|---|---|---|---|---|",
            f"| {c['overlaps']} | {c['fifo_inversions']} | {c['survivors_not_as_expected']} of {c['survivors']} | "
            f"{c['stale_tickets']} | {c['orphan_groups']} | {c['killed_without_history']} | "
            f"{h.get('none', '-')} / {h.get('pid', '-')} / {h.get('group', '-')} / {h.get('keeper', '-')} s "
            f"({c['hold_limit_s']} s) |"]
