"""A thousand waiters (`--only waiters`): N callers queued behind one
holder in a one-slot pool whose history says its runs take a minute (a
line of test suites: the quiet runs far back wait away, slotq/host/away.py),
then N = 100 in a fresh one-slot pool (no history: nobody knows the line is
slow, and every run keeps its interpreter; reported, not judged), then a
two-slot pool.

  Pss per queued caller   the caller's process and any helper of it (its
                          standby keeper; waiting away, its flock and its
                          watcher), /proc/PID/smaps_rollup, summed
                          and divided by N, once all N are in line and
                          again after the CPU windows (a full run: 60 s
                          later; the target is judged on the larger)
  idle CPU                CPU seconds all of them burn over WINDOW_S in line
                          (the scheduler's sum, to the ns: tools.proc_cpu;
                          the clock-tick figure runs before 2026-12-02
                          14:00 gave is kept in the JSON, idle_cpu_ticks_s),
                          once the line is in place and the machine quiet
                          (one heartbeat period: in two slots each quiet
                          caller refreshes its wait record once in it,
                          whenever it joined; in one slot, since
                          2026-12-03 22:00, none does -- its standby keeper
                          would close the record -- and before, that first
                          wake-up also copied the pages the caller shared
                          with its keeper). The target is judged on the
                          first window; a full run also measures the window
                          after it, the steady state
  completed, in order     every run ends `passed`; start order = ticket order
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from tools import REPO, SLOTQ, proc_cpu, proc_cpu_ticks, remove_work, settle

WINDOW_S = 30.0  # = the default --report-every, and a quiet caller's heartbeat period

# "0 CPU while they wait", as the idle scenario reads it for 50 waiters
# (<= 0.02 s over 20 s): at most 20 us of CPU per waiter and second. What
# remains at N = 1000 (the waiters are quiet: -q) is, in a pool of several
# slots, each caller refreshing its wait record every 30 s and each runner's
# 30 s safety poll; in one slot, nothing.
CPU_PER_WAITER_S = 0.02 / 50 / 20
PSS_LIMIT_MB = 4.0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


def _children(pids: set[int]) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) in pids:
                        out.append(int(entry))
            except OSError:
                pass
    return out


SLOW_RUN_S = 60.0  # a slow line: the pool's history says its runs take a minute (test suites)


def _seed_history(state: str, ran_s: float, runs: int = 5) -> None:
    """The pool's history, as a machine that has run test suites of
    `ran_s` has it: what a waiting run reads to decide whether to wait away
    (slotq's own history API; the runs are an hour old)."""
    sys.path.insert(0, str(REPO / "src"))
    from slotq import history

    os.makedirs(state, exist_ok=True)
    t = time.time() - 3600
    for i in range(runs):
        history.append(state, history.run_record(
            run_id=f"seed{i}", label="earlier suite", cls="shared", host=os.uname().nodename, outcome="passed",
            exit_code=0, message="", pool="shared",
            phases={"submitted": t, "slot": t, "started": t, "ended": t + ran_s},
            slot=None, ticket=None, budget=None, kept=None))


def _away(pids: list[int]) -> int:
    """How many of the callers wait away (a shell: slotq/host/away.py)."""
    sys.path.insert(0, str(REPO / "src"))
    from slotq.host.away import is_away

    return sum(1 for pid in pids if is_away(pid))


def _kept_pids(state: str, run_ids: set[str]) -> list[int]:
    """The processes of kept runs, by their tickets (each names its pid)."""
    sys.path.insert(0, str(REPO / "src"))
    from slotq.host.line import list_tickets, pool_dir, read_info

    out = []
    for _, path in list_tickets(pool_dir(state, "shared")):
        info = read_info(path) or {}
        if info.get("run_id") in run_ids and isinstance(info.get("pid"), int):
            out.append(int(info["pid"]))
    return out


def line_of(n: int, slots: int, windows: int = 2, slow: bool = True, kept: bool = False) -> dict[str, object]:
    """`slow`: the pool's history says its runs take a minute (a line of
    test suites: far-back quiet runs wait away); else a fresh pool, with
    no history (nobody knows the line is slow: every run keeps its
    interpreter). `kept`: the callers are kept runs (`run --detach`,
    what agents are told to use), each its own process once its caller
    left; their results taken with `slotq attach` after."""
    work = tempfile.mkdtemp(prefix="slotq-bench-waiters-")
    try:
        state = os.path.join(work, "state")
        if slow:
            _seed_history(state, SLOW_RUN_S)
        with open(os.path.join(work, "host.toml"), "w") as f:
            f.write(f"[pools]\nshared = {slots}\nlanding = 1\n")
        env = dict(os.environ, SLOTQ_STATE_DIR=state, SLOTQ_LEDGER=os.path.join(work, "ledger.sqlite"),
                   SLOTQ_CONFIG=os.path.join(work, "host.toml"))
        gate = os.path.join(work, "gate")
        hold = f'while [ ! -e {gate} ]; do sleep 0.05; done'
        holders = [subprocess.Popen([SLOTQ, "run", "-q", "--", "sh", "-c", hold], env=env,
                                    stdin=subprocess.DEVNULL) for _ in range(slots)]
        end = time.time() + 30
        while len(glob.glob(os.path.join(state, "tickets", "shared", "*.t"))) and time.time() < end:
            time.sleep(0.05)
        time.sleep(0.5)
        order_file = os.path.join(work, "order")
        procs, run_ids = [], []
        for i in range(n):
            if kept:
                run_ids.append(subprocess.run([SLOTQ, "run", "--detach", "--", "sh", "-c", f"echo {i} >> {order_file}"],
                                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                              timeout=60).stdout.strip())
                continue
            procs.append(subprocess.Popen([SLOTQ, "run", "-q", "--json", os.path.join(work, f"r{i}.json"), "--",
                                           "sh", "-c", f"echo {i} >> {order_file}"], env=env,
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        end = time.time() + 300
        while len(glob.glob(os.path.join(state, "tickets", "shared", "*.t"))) < n and time.time() < end:
            time.sleep(0.2)
        settle(cap=60.0)  # first status reports and standby keepers done: the line is in place
        pids = set(_kept_pids(state, set(run_ids))) if kept else {p.pid for p in procs}
        helpers = _children(pids)
        everyone = [*pids, *helpers]
        pss = sum(_pss_kb(p) for p in everyone)
        away = _away(list(pids))
        cpu0, ticks0 = sum(proc_cpu(p) for p in everyone), sum(proc_cpu_ticks(p) for p in everyone)
        time.sleep(WINDOW_S)
        cpu1 = sum(proc_cpu(p) for p in everyone)
        cpu = cpu1 - cpu0
        ticks = sum(proc_cpu_ticks(p) for p in everyone) - ticks0  # the measure of runs before 2026-12-02 14:00
        steady = None
        for _ in range(windows - 1):  # the steady state: after each caller's first wake-up in line
            time.sleep(WINDOW_S)
            cpu2 = sum(proc_cpu(p) for p in everyone)
            steady, cpu1 = cpu2 - cpu1, cpu2
        pss_later = sum(_pss_kb(p) for p in [*pids, *_children(pids)])  # (helpers may come and go)
        with open(gate, "w"):
            pass
        if kept:
            codes = [subprocess.run([SLOTQ, "attach", run_id, "--json", os.path.join(work, f"r{i}.json")], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=600).returncode for i, run_id in enumerate(run_ids)]
        else:
            codes = [p.wait(timeout=600) for p in procs]
        for h in holders:
            h.wait(timeout=60)
        # A caller that wrote no result (it failed before its end) counts
        # as not passed, and the line is still reported.
        records = [_result(os.path.join(work, f"r{i}.json")) for i in range(n)]
        outcomes = [str(r.get("outcome")) for r in records]
        tickets = [t if isinstance(t := r.get("ticket"), int) else 1 << 62 for r in records]
        started = [int(x) for x in open(order_file).read().split()]
        by_ticket = sorted(range(n), key=lambda i: tickets[i])
        inversions = sum(1 for a, b in zip(started, started[1:]) if tickets[a] > tickets[b]) if slots == 1 else None
        return {"n": n, "slots": slots, "slow": slow, "kept": kept, "away": away, "pss_mb_per_caller": round(pss / n / 1024, 2),
                "pss_mb_per_caller_later": round(pss_later / n / 1024, 2), "in_line_s": windows * WINDOW_S,
                "helpers": len(helpers), "idle_cpu_s": round(cpu, 3),
                "idle_cpu_next_window_s": None if steady is None else round(steady, 3),
                "idle_cpu_ticks_s": round(ticks, 3),
                "passed": sum(1 for c, o in zip(codes, outcomes) if c == 0 and o == "passed"),
                "inversions": inversions, "in_ticket_order": started == by_ticket if slots == 1 else None}
    finally:
        remove_work(work)


def _result(path: str) -> dict[str, object]:
    try:
        with open(path) as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return {"outcome": "no result"}


def run(ns: tuple[int, ...] = (100, 1000), two_slots: int | None = None, windows: int = 2,
        fresh: int | None = 100, kept: int | None = 100) -> dict[str, object]:
    """Slow one-slot lines of each N in `ns`, and of `kept` kept runs (none:
    skipped), a fresh one-slot pool of `fresh` callers (none: skipped),
    then a two-slot line of `two_slots` callers (default: the last N); each
    measured over `windows` report periods (--quick: one)."""
    out: dict[str, object] = {}
    for n in ns:
        out[f"one_slot_{n}"] = line_of(n, 1, windows)
        print(f"waiters: {out[f'one_slot_{n}']}", file=sys.stderr)
    if kept:
        out[f"one_slot_{kept}_kept"] = line_of(kept, 1, windows, kept=True)
        print(f"waiters: {out[f'one_slot_{kept}_kept']}", file=sys.stderr)
    if fresh:
        out[f"one_slot_{fresh}_fresh"] = line_of(fresh, 1, 1, slow=False)
        print(f"waiters: {out[f'one_slot_{fresh}_fresh']}", file=sys.stderr)
    n2 = ns[-1] if two_slots is None else two_slots
    out[f"two_slots_{n2}"] = line_of(n2, 2, windows)
    print(f"waiters: {out[f'two_slots_{n2}']}", file=sys.stderr)
    return out


def targets(r: dict[str, object]) -> list[tuple[str, bool, str]]:
    out = []
    for v in r.values():
        d: dict[str, float] = v  # type: ignore[assignment]
        n, slots = int(d["n"]), int(d["slots"])
        where = f"{slots} slot(s), N={n}" + ("" if d.get("slow", True) else ", fresh pool") \
            + (" kept runs" if d.get("kept") else "")
        out.append((f"waiters, {where}: every run passed" + (", in ticket order" if slots == 1 else ""),
                    d["passed"] == n and (slots != 1 or bool(d["in_ticket_order"])),
                    f"{d['passed']} of {n} passed" + (f", {d['inversions']} inversions" if slots == 1 else "")))
        limit = CPU_PER_WAITER_S * n * WINDOW_S
        out.append((f"waiters, {where}: idle CPU over {WINDOW_S:g} s <= {limit:.2f} s (20 us per waiter-second)",
                    d["idle_cpu_s"] <= limit, f"{d['idle_cpu_s']} s"))
        if slots == 1 and d.get("slow", True):  # (a fresh pool: reported, not judged -- nobody goes away there)
            pss = max(d["pss_mb_per_caller"], d.get("pss_mb_per_caller_later") or 0)
            out.append((f"waiters, {where}: Pss per queued caller <= {PSS_LIMIT_MB} MB (at entry and "
                        f"{d.get('in_line_s', WINDOW_S):g} s later)", pss <= PSS_LIMIT_MB,
                        f"{d['pss_mb_per_caller']} / {d.get('pss_mb_per_caller_later')} MB"))
    return out


def format_waiters(r: dict[str, object]) -> list[str]:
    lines = ["waiters (one holder, N queued callers), per queued caller and for all of them:",
             "| pool | N | waiting away | Pss per queued caller (its process + its helpers), at entry / later "
             f"| idle CPU of all, first {WINDOW_S:g} s / next {WINDOW_S:g} s | passed | start order |",
             "|---|---|---|---|---|---|---|"]
    for key, v in r.items():
        d: dict[str, object] = v  # type: ignore[assignment]
        order = ("ticket order" if d["in_ticket_order"] else f"{d['inversions']} inversions") \
            if d["slots"] == 1 else "–"
        later = d.get("pss_mb_per_caller_later")
        nxt = d.get("idle_cpu_next_window_s")
        pool = f"{d['slots']} slot(s)" + (f", runs of {SLOW_RUN_S:g} s" if d.get("slow", True) else ", fresh") \
            + (", kept runs (`run --detach`)" if d.get("kept") else "")
        lines.append(f"| {pool} | {d['n']} | {d.get('away', '–')} | {d['pss_mb_per_caller']}"
                     f"{'' if later is None else f' / {later}'} MB (after {d.get('in_line_s', WINDOW_S):g} s) "
                     f"| {d['idle_cpu_s']}{'' if nxt is None else f' / {nxt}'} s "
                     f"| {d['passed']} of {d['n']} | {order} |")
    return lines


if __name__ == "__main__":
    print("\n".join(format_waiters(run(tuple(int(a) for a in sys.argv[1:]) or (100, 1000)))))
