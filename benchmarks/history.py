"""The run history at scale (`--only history`): a million runs over six
months in the spool's monthly segments, as `slotq history` meets them.

  append      one run's history line (spool append under a shared flock), us
  catch-up    the per-user index reading all of it the first time, s; then
              after 1,000 more runs, ms
  query       a one-hour and a one-day window (index on the end time), ms
  cli         `slotq history --since 1h` as a user types it (interpreter,
              catch-up of nothing new, query, print), ms
  metrics     `slotq metrics` (a Prometheus scrape every 15 s) and `slotq
              status` beside it, on a host whose history holds 100,000 runs:
              the first (the index built) and the median of the next, ms
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import SLOTQ

DAY = 86400.0


def _record(i: int, end: float) -> str:
    return json.dumps({
        "run_id": f"{i:012x}", "user": ("alice", "bob", "ci", "agent")[i % 4], "uid": 1000 + i % 4,
        "label": f"pytest -q tests/part{i % 200}", "class": "shared", "pool": "shared", "slot": f"shared#{i % 2}",
        "host": "h", "outcome": "failed" if i % 7 == 0 else "passed", "exit_code": 1 if i % 7 == 0 else 0,
        "message": "command exited 0",
        "phases": {"submitted": end - 60, "slot": end - 40, "prepared": None, "started": end - 40, "ended": end},
        "waited_s": 20.0, "ran_s": 40.0}, separators=(",", ":"))


def run(n: int = 1_000_000) -> dict[str, object]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from slotq import history
    from slotq.history.index import Index

    work = Path(tempfile.mkdtemp(prefix="slotq-bench-history-"))
    try:
        state = work / "state"
        (state / "history").mkdir(parents=True)
        now = time.time()
        start = now - 180 * DAY
        step = 180 * DAY / n
        files: dict[str, list[str]] = {}
        for i in range(n):
            end = start + i * step
            files.setdefault(time.strftime("%Y-%m", time.gmtime(end)), []).append(_record(i, end))
        for month, lines in files.items():
            (state / "history" / f"{month}.jsonl").write_text("\n".join(lines) + "\n")
        size_mb = sum(f.stat().st_size for f in (state / "history").iterdir()) / 1e6
        t0 = time.perf_counter()
        for i in range(1000):
            history.append(str(state), json.loads(_record(n + i, now - 1000 + i)))
        append_us = (time.perf_counter() - t0) / 1000 * 1e6
        index = Index(str(state), 365 * DAY, path=str(work / "idx.sqlite"))
        t0 = time.perf_counter()
        read = index.catch_up()
        first_s = time.perf_counter() - t0
        for i in range(1000):
            history.append(str(state), json.loads(_record(n + 1000 + i, now - 500 + i / 2)))
        t0 = time.perf_counter()
        index.catch_up()
        incremental_ms = (time.perf_counter() - t0) * 1000
        hour: list[float] = []
        day: list[float] = []
        for k in range(15):
            at = start + (k + 1) * 10 * DAY
            for window, times in ((3600, hour), (DAY, day)):
                t0 = time.perf_counter()
                index.query(since=at, until=at + window)
                times.append((time.perf_counter() - t0) * 1000)
        index.close()
        env = dict(os.environ, SLOTQ_STATE_DIR=str(state), SLOTQ_LEDGER=str(work / "ledger.sqlite"))
        env.pop("SLOTQ_CONFIG", None)
        subprocess.run([SLOTQ, "history", "--since", "1h"], env=env, capture_output=True, check=True)  # index
        cli = []
        for _ in range(9):
            t0 = time.perf_counter()
            subprocess.run([SLOTQ, "history", "--since", "1h"], env=env, capture_output=True, check=True)
            cli.append((time.perf_counter() - t0) * 1000)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict[str, object] = {
        "runs": read, "segments_mb": round(size_mb), "append_us": round(append_us, 1),
        "first_catch_up_s": round(first_s, 1), "incremental_catch_up_ms": round(incremental_ms, 1),
        "query_hour_ms": round(statistics.median(hour), 2), "query_day_ms": round(statistics.median(day), 2),
        "cli_since_1h_ms": round(statistics.median(cli), 1)}
    print(f"history: {out}", file=sys.stderr)
    return out


def scrape(n: int = 100_000) -> dict[str, object]:
    """`slotq metrics` and `slotq status` on a history of `n` runs."""
    work = Path(tempfile.mkdtemp(prefix="slotq-bench-metrics-"))
    try:
        state = work / "state"
        (state / "history").mkdir(parents=True)
        now = time.time()
        step = 30 * DAY / n
        lines = [_record(i, now - 30 * DAY + i * step) for i in range(n)]
        (state / "history" / "2026-11.jsonl").write_text("\n".join(lines) + "\n")
        env = dict(os.environ, SLOTQ_STATE_DIR=str(state), SLOTQ_LEDGER=str(work / "ledger.sqlite"))
        env.pop("SLOTQ_CONFIG", None)
        out: dict[str, object] = {"runs": n}
        for name, argv in (("metrics", [SLOTQ, "metrics"]), ("status", [SLOTQ, "status"])):
            times = []
            for _ in range(8):
                t0 = time.perf_counter()
                subprocess.run(argv, env=env, capture_output=True, check=True)
                times.append((time.perf_counter() - t0) * 1000)
            out[f"{name}_first_ms"] = round(times[0], 1)
            out[f"{name}_ms"] = round(statistics.median(times[1:]), 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"scrape: {out}", file=sys.stderr)
    return out


def format_scrape(r: dict[str, object]) -> list[str]:
    return [f"a scrape on a host whose history holds {r['runs']:,} runs (target: `slotq metrics` within 1 s), "
            "medians of 7 after the first:",
            "| `slotq metrics` | its first (the index built) | `slotq status` | its first |",
            "|---|---|---|---|",
            f"| {r['metrics_ms']} ms | {r['metrics_first_ms']} ms | {r['status_ms']} ms | {r['status_first_ms']} ms |"]


def format_history(r: dict[str, object]) -> list[str]:
    return [f"history ({r['runs']:,} runs over 180 days, {r['segments_mb']} MB of segments), medians:",
            "| append one run | first index catch-up | catch-up after 1,000 more | 1-hour window | 1-day window "
            "| `slotq history --since 1h` |",
            "|---|---|---|---|---|---|",
            f"| {r['append_us']} µs | {r['first_catch_up_s']} s | {r['incremental_catch_up_ms']} ms "
            f"| {r['query_hour_ms']} ms | {r['query_day_ms']} ms | {r['cli_since_1h_ms']} ms |"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["scrape"]:
        print("\n".join(format_scrape(scrape())))
    else:
        print("\n".join(format_history(run(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000))))
