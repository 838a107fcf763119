"""Chaos: many callers on shared = 2 + landing = 1, a share of them SIGKILLed
at random moments in three styles, some commands hung (ignoring SIGTERM).

Used by tests/test_chaos.py (60 callers) and benchmarks/chaos (200):

    python tests/chaos.py [--callers N] [--seed S] [--json]

Kill styles: `pid` (the caller's process), `group` (the caller's whole
process group, as harnesses do on timeout), `keeper` (the run's
supervisor only). Every victim is killed only once the host knows its run
(a ticket or a slot record names it), at a random moment after that.

Measured: overlaps (a command starting while its pool already had as many
live command groups as slots), FIFO order among survivors (per pool, by the
host's queue time), outcomes of survivors, stale tickets and orphaned
command groups after the end, the longest slot hold of each kill style
(from a command's start until its process group is gone, watched from
/proc), and which killed runs have a history line.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUDGET, GRACE = 2.0, 0.5
SLOTS = {"shared": 2, "landing": 1}


def _slotq() -> list[str]:
    exe = Path(sys.executable).parent / "slotq"
    return [str(exe)] if exe.exists() else ["slotq"]


def _groups() -> set[int]:
    """Process groups with a live (non-zombie) member."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != b"Z":
                out.add(int(fields[2]))
    return out


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _known(state: Path, label: str) -> bool:
    """Does a ticket or a slot record name this run?"""
    needle = f'"label":"{label}"'.encode()
    for d in [state / "slots", *(state / "tickets").glob("*")]:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            try:
                with open(d / name, "rb") as f:
                    if needle in f.read(4096):
                        return True
            except OSError:
                continue
    return False


def _seed_slow_history(state: Path) -> None:
    """The pools' history says their runs take a minute: the quiet runs
    far back in the one-slot pool wait away (slotq/host/away.py)."""
    sys.path.insert(0, str(HERE.parent / "src"))
    from slotq import history

    state.mkdir(parents=True, exist_ok=True)
    t = time.time() - 3600
    for pool in SLOTS:
        for k in range(3):
            history.append(str(state), history.run_record(
                run_id=f"seed{pool}{k}", label="seed", cls=pool, host="h", outcome="passed", exit_code=0,
                message="", pool=pool, phases={"submitted": t, "slot": t, "started": t, "ended": t + 60},
                slot=None, ticket=None, budget=None, kept=None))


def run_chaos(work: Path, callers: int = 60, kill_share: float = 0.2, hung_share: float = 0.15,
              seed: int | None = None, spacing: float = 0.03, timeout: float = 120.0, slow: bool = False,
              landing_share: float = 0.25) -> dict[str, Any]:
    """`slow`: the pools' history says their runs take a minute, so that
    quiet runs far back in the one-slot pool (landing) wait away."""
    sys.path.insert(0, str(HERE.parent / "src"))
    from slotq.host.away import is_away

    rng = random.Random(seed)
    state, log = work / "state", work / "log"
    (work / "host.toml").write_text("[pools]\nshared = 2\nlanding = 1\n")
    if slow:
        _seed_slow_history(state)
    env = dict(os.environ, SLOTQ_STATE_DIR=str(state), SLOTQ_LEDGER=str(work / "ledger.sqlite"),
               SLOTQ_CONFIG=str(work / "host.toml"))
    plan = []
    for i in range(callers):
        pool = "landing" if rng.random() < landing_share else "shared"
        hung = rng.random() < hung_share
        style = rng.choice(["pid", "group", "keeper"]) if rng.random() < kill_share else None
        # A victim's command hangs (until its budget ends it): it is still
        # there, queued or running, at the random moment of its kill -- every
        # planned kill lands, whatever the machine's speed.
        hung = hung or style is not None
        plan.append((pool, hung, style, rng.uniform(0.0, 2.0), rng.uniform(0.05, 0.3)))

    starts: dict[int, tuple[str, int]] = {}  # pgid -> (pool, id)
    started_at: dict[int, float] = {}
    died_at: dict[int, float] = {}
    done = threading.Event()

    def watch() -> None:
        # Slot holds seen from outside: a command's start (its own log line)
        # until its process group has no live member.
        while not done.is_set():
            try:
                lines = log.read_text().splitlines()
            except OSError:
                lines = []
            for line in lines:
                p = line.split()
                if p and p[0] == "S" and int(p[3]) not in starts:
                    starts[int(p[3])] = (p[1], int(p[2]))
                    started_at[int(p[3])] = int(p[4]) / 1e9
            for i, proc in enumerate(list(procs)):
                if i not in went_away and proc.poll() is None and is_away(proc.pid):
                    went_away.add(i)
            live = _groups()
            now = time.monotonic()
            for g in starts:
                if g not in died_at and g not in live:
                    died_at[g] = now
            time.sleep(0.02)  # sleep-ok: the watcher's polling step

    procs: list[subprocess.Popen[bytes]] = []
    kills: dict[int, str] = {}  # caller index -> style applied
    went_away: set[int] = set()  # callers seen waiting away

    def kill(i: int, style: str, delay: float) -> None:
        proc, label = procs[i], f"chaos#{i}#"
        end = time.monotonic() + 20
        while not _known(state, label):
            if proc.poll() is not None or time.monotonic() > end:
                return
            time.sleep(0.01)  # sleep-ok: polling for the run to reach the host
        time.sleep(delay)  # sleep-ok: the random moment of the kill
        if proc.poll() is not None:
            return
        try:
            if style == "group":
                os.killpg(proc.pid, signal.SIGKILL)
            elif style == "pid":
                os.kill(proc.pid, signal.SIGKILL)
            else:
                keeper_end = time.monotonic() + 20  # a queued run of a 2-slot pool has none yet
                while not (kids := _children(proc.pid)) and time.monotonic() < keeper_end \
                        and proc.poll() is None:
                    time.sleep(0.01)  # sleep-ok: polling for a keeper to exist
                if not kids:
                    return
                os.kill(kids[0], signal.SIGKILL)
        except ProcessLookupError:
            return
        kills[i] = style

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    killers = []
    t0 = time.monotonic()
    for i, (pool, hung, style, delay, seconds) in enumerate(plan):
        mode = "hung" if hung else "quick"
        cmd = _slotq() + ["run", "-q", "--class", pool, "--budget", str(BUDGET), "--kill-grace", str(GRACE),
                          "--label", f"chaos#{i}#", "--report-every", "1", "--json", str(work / f"{i}.json"),
                          "--", sys.executable, str(HERE / "chaos_cmd.py"), str(log), pool, str(SLOTS[pool]),
                          str(i), mode, f"{seconds:.3f}"]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=env, cwd=work, start_new_session=True))
        if style:
            t = threading.Thread(target=kill, args=(i, style, delay), daemon=True)
            t.start()
            killers.append(t)
        time.sleep(spacing)  # sleep-ok: callers arrive one after another
    for p in procs:
        p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    for t in killers:
        t.join(timeout=10)
    elapsed = time.monotonic() - t0
    # Orphans: command groups still alive 5 s after the last caller ended.
    end = time.monotonic() + 5
    while set(starts) - set(died_at) and time.monotonic() < end:
        time.sleep(0.05)  # sleep-ok: bounded wait for the last groups to go
    done.set()
    watcher.join()
    orphans = sorted(set(starts) - set(died_at))
    for g in orphans:
        try:
            os.killpg(g, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Status removes tickets whose callers died unseen (and writes their
    # history lines); anything left after that is stale.
    subprocess.run(_slotq() + ["status", "--json"], env=env, capture_output=True, timeout=30)
    stale = [str(p) for p in (state / "tickets").glob("*/*") if p.is_file()]
    # A keeper writes its run's line after the command is gone: allow it a moment.
    end = time.monotonic() + 5
    while True:
        from written import history_written

        history = history_written(state)
        labels = {h.get("label") for h in history}
        missing = sorted(i for i in kills if f"chaos#{i}#" not in labels)
        if not missing or time.monotonic() > end:
            break
        time.sleep(0.05)  # sleep-ok: bounded wait for the last history lines

    results: dict[int, dict[str, Any]] = {}
    for i, p in enumerate(procs):
        f = work / f"{i}.json"
        if p.returncode != -signal.SIGKILL and f.exists() and f.stat().st_size:
            results[i] = json.loads(f.read_text())
    survivors = [i for i in range(callers) if i not in kills]
    # What each unexpected survivor got, with slotq's own words for why.
    bad = {i: f'{results.get(i, {}).get("outcome")}: {results.get(i, {}).get("message")}' for i in survivors
           if results.get(i, {}).get("outcome") != ("exec_timeout" if plan[i][1] else "passed")}
    # FIFO: in each pool, survivors start in the order of their tickets
    # (the host's sequence numbers; arrival order differs from it under load
    # by the callers' own start-up jitter).
    inversions = 0
    for pool in SLOTS:
        runs = sorted((results[i]["ticket"], results[i]["phases"]["started"])
                      for i in survivors if i in results and plan[i][0] == pool
                      and results[i].get("ticket") is not None and results[i]["phases"].get("started"))
        inversions += sum(1 for a, b in zip(runs, runs[1:]) if b[1] < a[1])
    holds: dict[str, float] = {}
    by_id = {ident: g for g, (_, ident) in starts.items()}
    for i in range(callers):
        found = by_id.get(i)
        if found is None or found not in died_at:
            continue
        style = kills.get(i, "none")
        holds[style] = max(holds.get(style, 0.0), died_at[found] - started_at[found])
    overlaps = [line for line in log.read_text().splitlines() if line.startswith("OVERLAP")] if log.exists() else []
    return {
        "callers": callers, "went_away": len(went_away), "killed_away": sorted(set(kills) & went_away),
        "elapsed_s": round(elapsed, 1), "killed": {s: sum(1 for v in kills.values() if v == s)
                                                                       for s in ("pid", "group", "keeper")},
        "overlaps": overlaps, "fifo_inversions": inversions, "survivors": len(survivors),
        "survivors_not_as_expected": bad, "stale_tickets": stale, "orphan_groups": orphans,
        "longest_hold_s": {k: round(v, 2) for k, v in sorted(holds.items())},
        "hold_limit_s": BUDGET + GRACE + 2,
        "killed_without_history": [(i, kills[i], plan[i][0], "hung" if plan[i][1] else "quick") for i in missing],
    }


def main() -> int:
    import argparse
    import shutil
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--callers", type=int, default=60)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="slotq-chaos-"))
    try:
        report = run_chaos(work, a.callers, seed=a.seed, timeout=600)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
