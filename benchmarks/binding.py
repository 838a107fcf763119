"""Several machines as one line (`--only binding`): late binding, side by
side with picking a host when the run is submitted and with one central
pool of as many slots.

Four "hosts" -- the test sshd's slotq-a..-d, one slot each, state dirs of
this run's own -- and one stream of callers: arrivals at random (Poisson,
at 80 % of the four slots' capacity), run times log-normal (median 2 s,
sigma 1: a few ten times longer than the median), seeded: the same stream
for every policy. Work dirs are shared (`--sync none`): no policy pays a
transfer the others do not.

  pick      --host a,b,c,d --spread 1   the shortest expected wait, asked at submit (before issue 49)
  late      --host a,b,c,d              a place in every line, the first slot won taken
  late 2    --host a,b,c,d --spread 2   in the 2 lines with the shortest expected wait
  ideal     --host a, a pool of 4 slots one central line

Per policy: mean and p95 of the callers' waits (`waited_s`), the mean
time from a caller's arrival to its command's start (as seen here: its
start-up and asking the hosts too), slot utilisation (run time over slots
x span), the hand-overs (each time a command ended while a caller waited:
the time until that host's next command started), and the checks: every
caller passed, no two commands at once on a one-slot host (at most 4 on
the ideal one), no command ran twice. Targets: late's mean wait <= 1.1x
and p95 <= 1.25x the ideal's.

`benchmarks/binding.py [CALLERS [POLICIES [OUT.json]]]` runs it alone
(e.g. `60 late,ideal`), OUT.json with every caller's arrival, start, wait
and host.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from remote import sshd
from tools import SLOTQ

HOSTS = ("slotq-a", "slotq-b", "slotq-c", "slotq-d")
REMOTE_SLOTQ = "/home/slotqtest/venv/bin/slotq"
POLICIES = {  # name: (hosts, extra options, slots)
    "pick": (HOSTS, ["--spread", "1"], 4),
    "late": (HOSTS, [], 4),
    "late 2": (HOSTS, ["--spread", "2"], 4),
    "ideal": (HOSTS[:1], [], 4),
}


def stream(callers: int, seed: int, median: float = 2.0, sigma: float = 1.0, load: float = 0.8
           ) -> list[tuple[float, float]]:
    """(arrival, run time) of each caller, seconds from the start."""
    rng = random.Random(seed)
    mean_run = median * math.exp(sigma * sigma / 2)
    rate = load * 4 / mean_run
    at, out = 0.0, []
    for _ in range(callers):
        at += rng.expovariate(rate)
        out.append((round(at, 3), round(min(rng.lognormvariate(math.log(median), sigma), 60.0), 3)))
    return out


def one(policy: str, calls: list[tuple[float, float]], cfg: str, work: Path, env: dict[str, str]
        ) -> dict[str, object]:
    hosts, extra, slots = POLICIES[policy]
    tag = uuid.uuid4().hex[:8]
    state = f"$HOME/lb-bench-{tag}-$SLOTQ_TEST_HOST"
    remote_slotq = f"SLOTQ_STATE_DIR={state} SLOTQ_LEDGER={state}/ledger/l.sqlite {REMOTE_SLOTQ}"
    if policy == "ideal":
        config = f"$HOME/lb-bench-{tag}.toml"
        subprocess.run(["ssh", "-F", cfg, hosts[0], f"printf '[pools]\\nshared = {slots}\\nlanding = 1\\n' > {config}"],
                       check=True, timeout=30, stdin=subprocess.DEVNULL)
        remote_slotq = f"SLOTQ_CONFIG={config} {remote_slotq}"
    args = ["--host", ",".join(hosts), *extra, "--ssh-config", cfg, "--remote-slotq", remote_slotq,
            "--sync", "none"]
    log = work / f"log-{tag}"
    log.touch()
    log.chmod(0o666)  # the commands run as the test sshd's user
    for h in hosts:  # the masters and handshakes, before the clock starts
        subprocess.run([SLOTQ, "run", "-q", "--host", h, *args[2:], "--", "true"], cwd=work, env=env,
                       check=True, timeout=60, stdin=subprocess.DEVNULL, capture_output=True)
    results: list[dict[str, object] | None] = [None] * len(calls)
    t0, wall0 = time.monotonic(), time.time()

    def caller(i: int, arrival: float, seconds: float) -> None:
        time.sleep(max(0.0, t0 + arrival - time.monotonic()))
        script = (f'echo "s {tag}-{i} $SLOTQ_TEST_HOST $(date +%s.%N)" >> {log}; sleep {seconds}; '
                  f'echo "e {tag}-{i} $SLOTQ_TEST_HOST $(date +%s.%N)" >> {log}')
        done = subprocess.run([SLOTQ, "run", "-q", "--json", "-", *args, "--label", f"caller-{i}", "--",
                               "sh", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                              timeout=1800, stdin=subprocess.DEVNULL)
        try:
            results[i] = dict(json.loads(done.stdout.splitlines()[-1]), exit=done.returncode)
        except (IndexError, ValueError):
            results[i] = {"exit": done.returncode, "stderr": done.stderr[-500:]}

    threads = [threading.Thread(target=caller, args=(i, a, s)) for i, (a, s) in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        return _judge(policy, results, log.read_text(), slots, [wall0 + a for a, _ in calls])
    finally:
        for h in hosts:
            subprocess.run(["ssh", "-F", cfg, h, f'rm -rf {state} "$HOME/lb-bench-{tag}.toml"'], timeout=30,
                           stdin=subprocess.DEVNULL, capture_output=True)


def _judge(policy: str, results: list[dict[str, object] | None], log: str, slots: int, arrived: list[float]
           ) -> dict[str, object]:
    waits = [float(w) for r in results if r and isinstance(w := r.get("waited_s"), (int, float))]
    failed = [r for r in results if not r or r.get("exit") != 0]
    starts: dict[str, list[tuple[float, str]]] = {}  # host -> (time, "s"/"e")
    ran: dict[str, int] = {}
    for line in log.splitlines():
        mark, token, host, at = line.split()
        starts.setdefault(host, []).append((float(at), mark))
        if mark == "s":
            ran[token] = ran.get(token, 0) + 1
    most = 0
    for events in starts.values():
        busy = 0
        for _, mark in sorted(events, key=lambda e: (e[0], e[1] == "s")):  # an end before a start at one time
            busy += 1 if mark == "s" else -1
            most = max(most, busy)
    times = [t for events in starts.values() for t, _ in events]
    span = max(times) - min(times) if times else 0.0
    busy_s = sum(t if m == "e" else -t for events in starts.values() for t, m in events)
    gaps = _handover_gaps(log, arrived)
    began = _starts(log)
    delays = [began[i] - a for i, a in enumerate(arrived) if i in began]
    return {
        "callers": len(results), "failed": len(failed), "twice": sum(1 for n in ran.values() if n > 1),
        "most_at_once_per_host": most, "allowed_per_host": slots if policy == "ideal" else 1,
        "mean_wait_s": round(statistics.fmean(waits), 3) if waits else None,
        "mean_start_delay_s": round(statistics.fmean(delays), 3) if delays else None,  # arrival to start, as seen here
        "p95_wait_s": round(statistics.quantiles(waits, n=20)[18], 3) if len(waits) >= 2 else None,
        "utilisation": round(busy_s / (4 * span), 3) if span else None,
        "handover_median_ms": round(statistics.median(gaps) * 1000, 1) if gaps else None,
        "handover_mean_ms": round(statistics.fmean(gaps) * 1000, 1) if gaps else None,
        "handovers": len(gaps),
        "failures": [f.get("stderr") if f else "no result" for f in failed][:3],
        "calls": [{"arrived": round(a, 3), "started": began.get(i), "waited_s": r.get("waited_s") if r else None,
                   "host": r.get("host") if r else None} for i, (a, r) in enumerate(zip(arrived, results))],
    }


def _starts(log: str) -> dict[int, float]:
    """caller number -> when its command started (wall clock)."""
    out = {}
    for line in log.splitlines():
        mark, token, _, at = line.split()
        if mark == "s":
            out[int(token.rpartition("-")[2])] = float(at)
    return out


def _handover_gaps(log: str, arrived: list[float]) -> list[float]:
    """Each time a command ended on a host while a caller was waiting: the
    seconds until the host's next command started -- the slot's idle time
    a late-bound caller's offer and answer add to the hand-over."""
    started = _starts(log)
    per_host: dict[str, list[tuple[float, str]]] = {}
    for line in log.splitlines():
        mark, _, host, at = line.split()
        per_host.setdefault(host, []).append((float(at), mark))
    gaps = []
    for events in per_host.values():
        events.sort()
        for (t_end, m1), (t_next, m2) in zip(events, events[1:]):
            waiting = any(a <= t_end < started.get(i, math.inf) for i, a in enumerate(arrived))
            if m1 == "e" and m2 == "s" and waiting:
                gaps.append(t_next - t_end)
    return gaps


def run(callers: int = 60, seed: int = 49, policies: tuple[str, ...] = tuple(POLICIES)) -> dict[str, object]:
    calls = stream(callers, seed)
    out: dict[str, object] = {"callers": callers, "seed": seed, "policies": {}}
    with sshd() as cfg:
        work = Path(tempfile.mkdtemp(prefix="slotq-bench-binding-"))
        work.chmod(0o755)  # the commands' work dir, on the "hosts" too (--sync none)
        runtime = work / "runtime"
        runtime.mkdir(mode=0o700)
        env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), SLOTQ_LEDGER=str(work / "ledger.sqlite"),
                   XDG_CONFIG_HOME=str(work / "config"))
        try:
            for policy in policies:
                out["policies"][policy] = one(policy, calls, cfg, work, env)  # type: ignore[index]
        finally:
            for sock in (runtime / "slotq-ssh").glob("*") if (runtime / "slotq-ssh").is_dir() else []:
                subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=20)
            shutil.rmtree(work, ignore_errors=True)
    return out


def targets(r: dict[str, object]) -> list[tuple[str, bool, str]]:
    p: dict[str, dict[str, object]] = r["policies"]  # type: ignore[assignment]
    late, ideal = p["late"], p["ideal"]
    out = []
    for key, limit in (("mean_wait_s", 1.1), ("p95_wait_s", 1.25)):
        a, b = late.get(key), ideal.get(key)
        ok = isinstance(a, float) and isinstance(b, float) and a <= limit * max(b, 0.05)
        out.append((f"late binding {key[:-7]} wait <= {limit}x one central pool's", ok,
                    f"{a} s vs {b} s ({a / b:.2f}x)" if isinstance(a, float) and isinstance(b, float) and b else
                    f"{a} vs {b}"))
    sound = all(v["failed"] == 0 and v["twice"] == 0
                and int(v["most_at_once_per_host"]) <= int(v["allowed_per_host"])  # type: ignore[call-overload]
                for v in p.values())
    out.append(("every caller passed, never two commands on a one-slot host, none twice", sound,
                "; ".join(f"{k}: {v['failed']} failed, {v['twice']} twice, at most {v['most_at_once_per_host']} "
                          f"at once" for k, v in p.items())))
    return out


def format_binding(r: dict[str, object]) -> list[str]:
    p: dict[str, dict[str, object]] = r["policies"]  # type: ignore[assignment]
    ideal = p["ideal"]
    lines = [f"several hosts as one line: {r['callers']} callers (seed {r['seed']}), 4 one-slot hosts over ssh, "
             "log-normal run times (median 2 s, sigma 1), arrivals at 80 % of capacity",
             "| policy | mean wait | p95 wait | vs one pool (mean, p95) | arrival to start, mean | utilisation | "
             "hand-over median, mean (n) | failed | twice |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, v in p.items():
        ratio = ", ".join(f"{float(v[k]) / float(ideal[k]):.2f}x" if v.get(k) and ideal.get(k) else "-"  # type: ignore[arg-type]
                          for k in ("mean_wait_s", "p95_wait_s"))
        lines.append(f"| {name} | {v['mean_wait_s']} s | {v['p95_wait_s']} s | {ratio} | {v['mean_start_delay_s']} s | "
                     f"{v['utilisation']} | "
                     f"{v['handover_median_ms']} ms, {v['handover_mean_ms']} ms ({v['handovers']}) | "
                     f"{v['failed']} | {v['twice']} |")
    return lines


if __name__ == "__main__":
    import sys

    report = run(int(sys.argv[1]) if len(sys.argv) > 1 else 60,
                 policies=tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else tuple(POLICIES))
    if len(sys.argv) > 3:
        Path(sys.argv[3]).write_text(json.dumps(report, indent=1))
    print("\n".join(format_binding(report)))
    for name, ok, detail in targets(report):
        print(f"- {'PASS' if ok else 'MISS'} {name}: {detail}")
