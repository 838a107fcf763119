"""The scenarios every tool runs side by side (bench.py's table): each
takes a Tool (tools.py) in a fresh work dir and returns its figures. What
each measures: bench.py's doc and docs/performance.md, "Benchmarks"."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tools import PYTHON, SLOTQ, Slotq, Tool, Tsp, busy_s, proc_cpu, settle

REPO_SRC = Path(__file__).resolve().parent.parent / "src"


def now_ns() -> int:
    return time.time_ns()


def wait_started(tool: "Tool", path: Path, n: int, timeout: float, what: str) -> None:
    """Wait for n start stamps; fail at once if every caller has exited
    without them (a lost caller would otherwise cost the whole timeout)."""
    wait_until(lambda: len(lines(path)) >= n or tool.all_exited(), timeout, what, 0.02)
    if len(lines(path)) < n:
        time.sleep(0.2)  # stamps of the last exits may still be landing
        if len(lines(path)) < n:
            raise TimeoutError(f"{tool.name}: only {len(lines(path))} of {n} callers ran; the others were lost")


def wait_until(cond, timeout: float, what: str, interval: float = 0.01):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def lines(path: Path) -> list[str]:
    try:
        return path.read_text().split("\n")[:-1]
    except FileNotFoundError:
        return []


def gate_loop(gate: Path) -> str:
    # Also ends when the scenario's work dir is gone: a holder whose tool was
    # killed at teardown (flock's child, task-spooler's job) would otherwise
    # loop -- and fork `sleep` 100 times a second -- for the rest of the run.
    return f'while [ ! -e {gate} ] && [ -d {gate.parent} ]; do sleep 0.01; done'


def hold(tool: Tool, gate: Path, extra: str = "") -> None:
    held = tool.work / "held"
    tool.start(f"touch {held}; {gate_loop(gate)}{extra}")
    wait_until(held.exists, 30, f"{tool.name} holder")


def handoff(tool: Tool, n: int) -> dict[str, float]:
    gate, end, starts = tool.work / "gate", tool.work / "end", tool.work / "starts"
    hold(tool, gate, f"; date +%s%N > {end}")
    for i in range(n):
        tool.start(f'echo "$(date +%s%N) {i}" >> {starts}')
    wait_until(lambda: tool.queued() >= n, 300, f"{n} {tool.name} waiters queued", 0.05)
    if tool.quiet_line:
        settle()  # the line in place and quiet,
    time.sleep(1.0)  # then the holder keeps the slot about a second more
    busy0 = busy_s()
    gate.touch()
    wait_started(tool, starts, n, 600, f"{n} {tool.name} waiters started")
    # What the whole machine spent per hand-over, from the release to the
    # last start (the tool, the commands, the bookkeeping of runs that
    # ended; in a short line also the last runs' ends, after the last
    # start): on C cores a long line's gap cannot stay under this / C.
    cpu_ms = (busy_s() - busy0) * 1000 / n
    t_end = int(end.read_text())
    ts = sorted(int(line.split()[0]) for line in lines(starts))
    gaps = [(b - a) / 1e6 for a, b in zip(ts, ts[1:])]
    return {"latency_ms": (ts[0] - t_end) / 1e6, "gap_ms": statistics.median(gaps) if gaps else float("nan"),
            "cpu_ms": cpu_ms}


def idle(tool: Tool, n: int = 50, window: float = 20.0) -> dict[str, float]:
    gate = tool.work / "gate"
    hold(tool, gate)
    for _ in range(n):
        tool.start("true")
    wait_until(lambda: tool.queued() >= n, 300, f"{n} {tool.name} waiters queued", 0.05)
    time.sleep(1.0)  # start-up done
    pids = tool.waiting_pids()
    before = {p: proc_cpu(p) for p in pids}
    time.sleep(window)
    pids_after = set(tool.waiting_pids()) | set(pids)
    cpu = sum(proc_cpu(p) - before.get(p, 0.0) for p in pids_after)
    gate.touch()
    return {"cpu_s": cpu}


def order(tool: Tool, n: int = 20, spacing: float = 0.02) -> dict[str, float]:
    gate, starts = tool.work / "gate", tool.work / "starts"
    hold(tool, gate)
    t0 = time.monotonic()
    for i in range(n):
        # Arrival i at t0 + i * spacing.
        delay = t0 + i * spacing - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        # Each command stamps its start and its end: besides the order, the
        # run checks that no two ever held the one slot at once.
        tool.start(f'echo "S $(date +%s%N) {i}" >> {starts}; echo "E $(date +%s%N) {i}" >> {starts}',
                   label=f"order-{i}")
    wait_until(lambda: tool.queued() >= n, 120, f"{tool.name} callers queued", 0.05)
    time.sleep(0.5)
    line = tool.line() if isinstance(tool, Slotq) else []
    gate.touch()
    wait_started(tool, starts, 2 * n, 300, f"{tool.name} callers started")
    events = sorted((int(t), kind, int(i)) for kind, t, i in (line.split() for line in lines(starts)))
    seq = [i for _, kind, i in events if kind == "S"]
    inversions = sum(1 for i in range(n) for j in range(i + 1, n) if seq[i] > seq[j])
    out = {"inversions": float(inversions)}
    if isinstance(tool, Slotq):
        # slotq's own order: start order against the line as it stood
        # before the gate opened (the host's ticket numbers, taken after
        # each caller's Python start-up): are the inversions above the
        # queue's, or the start-ups'?
        rank = {int(label[6:]): r for r, label in enumerate(x for x in line if x.startswith("order-"))}
        ranked = [rank[i] for i in seq if i in rank]
        out["queue_inversions"] = float(sum(1 for a in range(len(ranked)) for b in range(a + 1, len(ranked))
                                            if ranked[a] > ranked[b])) if len(ranked) == n else float("nan")
    running, overlaps = 0, 0
    for _, kind, _ in events:
        if kind == "S":
            overlaps += running > 0
            running += 1
        else:
            running -= 1
    out["overlaps"] = float(overlaps)
    return out


def throughput(tool: Tool, n: int = 200) -> dict[str, float]:
    done = tool.work / "done"
    t0 = time.monotonic()
    for _ in range(n):
        tool.start(f"echo x >> {done}")
    wait_started(tool, done, n, 900, f"{n} {tool.name} commands")
    wall = time.monotonic() - t0
    return {"wall_s": wall, "per_s": n / wall}


def percall(tool: Tool, reps: int = 20) -> dict[str, float]:
    """One uncontended call. Each call is paired with a bare `python -c
    pass` run just before it, so both see the same machine (these machines
    drift by 10-20% within minutes): `x_python` is the ratio of the medians
    of the same repetition."""
    if isinstance(tool, Tsp):
        argv = ["tsp", "-n", "-f", "true"]  # -f: wait for the job
    elif isinstance(tool, Slotq):
        argv = [SLOTQ, "run", "-q", "--", "true"]
    else:
        argv = tool.argv("true")

    def timed(cmd: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(cmd, env=tool.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=tool.work)
        return time.perf_counter() - t

    bare, bare_s = [PYTHON, "-c", "pass"], [PYTHON, "-S", "-c", "pass"]
    timed(argv)  # warm: caches, server start
    timed(bare)
    timed(bare_s)
    tool_s, python_s, python_nosite_s = [], [], []
    for _ in range(reps):
        python_s.append(timed(bare))
        python_nosite_s.append(timed(bare_s))
        tool_s.append(timed(argv))
    ms, py = statistics.median(tool_s) * 1000, statistics.median(python_s) * 1000
    py_s = statistics.median(python_nosite_s) * 1000
    # The target is against `python -c pass`. slotq's own launcher starts
    # without site (`python -S`, scripts/write_launcher.py): what site costs
    # a bare start is shown beside it.
    return {"ms": ms, "python_ms": py, "x_python": ms / py, "python_S_ms": py_s}


def comeback(tool: Tool, reps: int = 10) -> dict[str, float]:
    """A job started and left (slotq: `run --detach`; tsp: a queued job),
    ended, and its result asked for: the time of that ask."""
    env = tool.env()

    def out(cmd: list[str]) -> str:
        return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              cwd=tool.work, timeout=60).stdout.strip()

    def timed(cmd: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=tool.work,
                       timeout=60)
        return time.perf_counter() - t

    def ended_job() -> list[str]:
        """Start a job, wait for its end without asking for it: the ask."""
        if isinstance(tool, Tsp):
            job = out(["tsp", "echo", "hello"])
            out(["tsp", "-w", job])
            return ["tsp", "-c", job]
        sys.path.insert(0, str(REPO_SRC))
        from slotq.host import kept

        job = out([SLOTQ, "run", "--detach", "--", "echo", "hello"])
        alive = os.path.join(tool.work, "kept", job, "alive")  # beside SLOTQ_LEDGER
        wait_until(lambda: not kept.held(alive), 30, "the kept run's end")
        return [SLOTQ, "attach", job]

    bare = [PYTHON, "-c", "pass"]
    timed(ended_job())  # warm
    ask_s, python_s = [], []
    for _ in range(reps):
        ask = ended_job()
        python_s.append(timed(bare))
        ask_s.append(timed(ask))
    ms, py = statistics.median(ask_s) * 1000, statistics.median(python_s) * 1000
    return {"ms": ms, "python_ms": py, "x_python": ms / py}


def crash(tool: Tool, orphan_s: float = 5.0) -> dict[str, float]:
    hpid, wstart, verdict = tool.work / "hpid", tool.work / "wstart", tool.work / "verdict"
    tool.start(f"echo $$ > {hpid}; sleep {orphan_s}")
    pid = int(wait_until(lambda: hpid.exists() and hpid.read_text().strip(), 30, "holder command"))
    # Still running = exists and is not a zombie (an orphan's zombie may wait
    # for init to reap it; it runs nothing and holds nothing).
    tool.start(f"date +%s%N > {wstart}; s=$(cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null); "
               f'if [ -n "$s" ] && [ "$s" != Z ]; then echo overlap; else echo clean; fi > {verdict}')
    wait_until(lambda: tool.queued() >= 1, 60, f"{tool.name} waiter queued", 0.02)
    time.sleep(0.5)
    victim = tool.holder_process(pid)
    t_kill = now_ns()
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: verdict.exists() and verdict.read_text().strip(), 20, f"{tool.name} next waiter", 0.005)
    return {"handoff_ms": (int(wstart.read_text()) - t_kill) / 1e6,
            "overlap": 1.0 if verdict.read_text().strip() == "overlap" else 0.0}


def bare_times(reps: int = 20) -> dict[str, float]:
    def med(argv: list[str]) -> float:
        subprocess.run(argv)
        xs = []
        for _ in range(reps):
            t = time.perf_counter()
            subprocess.run(argv)
            xs.append(time.perf_counter() - t)
        return statistics.median(xs) * 1000

    return {"true_ms": med(["true"]), "python_ms": med([PYTHON, "-c", "pass"])}
