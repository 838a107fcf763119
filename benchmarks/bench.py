#!/usr/bin/env python3
"""slotq against the tools people use today, side by side in one run.

Anchors: flock(1) (util-linux), GNU parallel's `sem`, task-spooler (`tsp`).
Every scenario runs each tool in turn, repetition by repetition (so noise
spreads evenly), and reports medians and ratios against flock(1).

    benchmarks/run                 # installs the anchors, runs everything
    benchmarks/run --quick         # fewer repetitions, no N=500 or 1000, one chaos run, two lines of waiters
    SLOTQ_BENCH_SLOTQ=/other/checkout/.venv/bin/slotq benchmarks/run --only handoff
                                   # another build measured by this harness (an A/B of two commits)

Scenarios (see docs/performance.md, "Benchmarks"):
  handoff     one holder has the only slot; N waiters queued behind it; each
              stamps its start. latency = first start - holder's end; gap =
              median time between successive starts. Nine repetitions for
              N <= 50 (one latency sample each), three for N = 500 and 1000.
              The holder lets go once the line is in place and the machine
              quiet (settle), and a second later. cpu_ms = the whole
              machine's busy CPU from the release to the last start, per
              hand-over: on C cores a long line's gap cannot stay under
              cpu_ms / C.
  idle        50 waiters behind a holder for 20 s: CPU seconds they burn.
  order       20 callers arriving 20 ms apart: start-order inversions, and
              overlaps (each command stamps its start and its end: two in
              the one slot at once would show).
  throughput  200 trivial commands through 2 slots, all launched at once.
  percall     one uncontended call, each paired with a bare interpreter
              start (`python -c pass`, and `python -S -c pass`: slotq's
              launcher starts without site) just before it.
  comeback    the result of a job that ended while nobody watched, asked for
              later: `slotq attach ID` of a kept run (`run --detach`) against
              `tsp -c ID` (task-spooler's output of a finished job), each
              paired with a bare interpreter start; flock and sem keep no job
              to come back to.
  crash       the holder is SIGKILLed: time until the next waiter starts, and
              whether the dead holder's command was still running then.
  slurm       slotq --slurm against raw srun (submit -> start) and raw sbatch
              (hand-over) on a private one-node cluster; benchmarks/slurm.py.
  waiters     slotq alone: N = 100 and 1000 callers queued in a one-slot pool
              (Pss per queued caller, idle CPU, all pass, ticket order) and
              N = 1000 in a two-slot pool; benchmarks/memory.py.
  remote      slotq --host against raw ssh + python + rsync over the same warm
              master, one-file and 20,000-file trees; benchmarks/remote.py.
  binding     several hosts as one line: late binding over 4 one-slot hosts
              against picking one at submit and one central 4-slot pool, the
              same seeded heavy-tailed stream of callers; benchmarks/binding.py.
  history     slotq alone: a million runs in the run history (append, index
              catch-up, window queries, `slotq history`); benchmarks/history.py.
  chaos       slotq alone (the anchors' crash behaviour is the scenario above):
              200 callers on shared = 2 + landing = 1, a fifth SIGKILLed at
              random moments (caller pid, caller process group, or the
              run's supervisor only), some commands hung; tests/chaos.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from chaosbench import chaos, format_chaos
from scenarios import bare_times, comeback, crash, handoff, idle, order, percall, throughput
from tables import check_targets, table
from tools import PYTHON, TOOLS, remove_work, settle

HERE = Path(__file__).resolve().parent


def measure(tool_names: list[str], scenario: str, fn, reps: int, slots: int = 1,  # type: ignore[no-untyped-def]
            skip: dict[str, str] | None = None) -> dict[str, dict[str, object]]:
    samples: dict[str, list[dict[str, float]]] = {t: [] for t in tool_names}
    notes: dict[str, str] = dict(skip or {})
    for rep in range(reps):
        for name in tool_names:
            if name in notes:
                continue
            work = Path(tempfile.mkdtemp(prefix=f"slotq-bench-{name}-"))
            tool = TOOLS[name](work, slots)
            settle()
            try:
                samples[name].append(fn(tool))
            except TimeoutError as e:
                notes[name] = str(e)
            finally:
                tool.teardown()
                remove_work(work)
        print(f"  {scenario}: repetition {rep + 1}/{reps} done", file=sys.stderr, flush=True)
    out: dict[str, dict[str, object]] = {}
    for name in tool_names:
        xs = samples[name]
        if not xs:
            out[name] = {"note": notes.get(name, "no samples")}
            continue
        entry: dict[str, object] = {"n": len(xs)}
        for key in xs[0]:
            vals = [x[key] for x in xs]
            entry[key] = statistics.median(vals)
            entry[key + "_min"] = min(vals)
            entry[key + "_max"] = max(vals)
        if name in notes:
            entry["note"] = notes[name]
        out[name] = entry
    return out


Results = dict[str, dict[str, dict[str, object]]]


def main() -> int:
    args = parse_args()
    tools = args.tools.split(",")
    only = set(args.only.split(",")) if args.only else None
    results: Results = {}
    started = time.time()
    bare = bare_times()
    print(f"bare: true {bare['true_ms']:.1f} ms, {PYTHON} -c pass {bare['python_ms']:.1f} ms", file=sys.stderr)
    lap = Laps()
    side_by_side(args, tools, lambda s: only is None or s in only, results, lap)
    own_text, own_targets = slotq_alone(args, lambda s: only is None or s in only, results, lap)
    text = [f"slotq benchmarks, {time.strftime('%Y-%m-%d %H:%M')} on {os.uname().nodename} "
            f"({os.cpu_count()} cores), {time.time() - started:.0f} s; medians [min–max] of the repetitions",
            f"bare: `true` {bare['true_ms']:.1f} ms, `{Path(PYTHON).name} -c pass` {bare['python_ms']:.1f} ms", "",
            table({k: v for k, v in results.items() if k not in OWN_SCENARIOS}, tools),
            *own_text, "", "targets:", *check_targets(results), *own_targets]
    notes = [f"- {t} in {s}: {e['note']}" for s, per in results.items() for t, e in per.items() if "note" in e]
    if notes:
        text += ["", "notes:", *notes]
    write_report("\n".join(text), {"bare": bare, "results": results}, Path(args.out))
    return 0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fewer repetitions, no N=500 or 1000, one chaos run, two lines of waiters")
    ap.add_argument("--only", help="comma-separated scenarios: handoff,idle,order,throughput,percall,comeback,"
                                   "crash,waiters,remote,binding,slurm,mcp,history,chaos")
    ap.add_argument("--chaos-callers", type=int, default=200, help="callers in the chaos scenario (default 200)")
    ap.add_argument("--tools", default="slotq,flock,sem,task-spooler")
    ap.add_argument("--reps", type=int, help="repetitions per scenario (default 5; 2 with --quick)")
    ap.add_argument("--handoff-n", help="comma-separated waiter counts for handoff (default 1,10,50,500,1000)")
    ap.add_argument("--out", default=str(HERE / "results"), help="directory for the results files")
    return ap.parse_args()


class Laps:
    """How long each scenario took (--quick must stay under 10 minutes)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        print(f"[bench] {name}: {now - self.last:.0f} s", file=sys.stderr)
        self.last = now


def side_by_side(args: argparse.Namespace, tools: list[str], want, results: Results,  # type: ignore[no-untyped-def]
                 lap: Laps) -> None:
    """The scenarios every tool runs (the table)."""
    reps = args.reps or (2 if args.quick else 5)
    if want("handoff"):
        handoffs(args, tools, results, lap)
    if want("idle"):
        results["idle 50 waiters / 20 s"] = measure(tools, "idle", idle, 1 if args.quick else 2)
        lap("idle")
    if want("order"):
        results["order 20 callers"] = measure(tools, "order", order, reps)
        lap("order")
    if want("throughput"):
        results["throughput 200 cmds / 2 slots"] = measure(tools, "throughput", throughput,
                                                          2 if args.quick else 3, slots=2)
        lap("throughput")
    if want("percall"):
        results["per-call overhead"] = measure(tools, "percall", percall, 3 if reps >= 3 else reps)
        lap("percall")
    if want("comeback"):
        none = "keeps no job to come back to"
        results["come back to an ended job"] = measure(tools, "comeback", comeback, 2 if args.quick else 3,
                                                       skip={"flock": none, "sem": none})
        lap("comeback")
    if want("crash"):
        results["crash handoff"] = measure(tools, "crash", crash, 2 if args.quick else 3)
        lap("crash")


def handoffs(args: argparse.Namespace, tools: list[str], results: Results, lap: Laps) -> None:
    reps = args.reps or (2 if args.quick else 5)
    hand_reps = args.reps or (3 if args.quick else 9)
    sizes = [int(x) for x in args.handoff_n.split(",")] if args.handoff_n else \
        [1, 10, 50] + ([] if args.quick else [500, 1000])
    for n in sizes:
        skip: dict[str, str] = {}
        if n >= 500:
            skip["sem"] = (f"skipped at N={n}: sem waiters poll with back-off; hundreds take many minutes")
        if n >= 1000:
            # Seen on 2026-12-01: with ~1000 clients queued, tsp's server
            # stopped answering (`tsp -l` hung until killed).
            skip["task-spooler"] = f"skipped at N={n}: its server stopped answering with ~1000 clients queued"
        results[f"handoff N={n}"] = measure(tools, f"handoff N={n}", lambda t, n=n: handoff(t, n),
                                           # one latency sample per repetition: more of them
                                           hand_reps if n < 500 else max(3, (reps + 1) // 2), skip=skip)
        lap(f"handoff N={n}")


OWN_SCENARIOS = ("chaos", "slurm", "history", "remote", "binding", "waiters", "mcp")


def slotq_alone(args: argparse.Namespace, want, results: Results,  # type: ignore[no-untyped-def]
                lap: Laps) -> tuple[list[str], list[str]]:
    """The scenarios of slotq alone, in modules of their own: each has
    run(), format_*() and maybe targets(); their text follows the table.
    Returns that text and their targets' lines."""
    text: list[str] = []
    targets: list[str] = []

    def own(key: str, report: dict[str, object], lines: list[str],
            checks: list[tuple[str, bool, str]] | None = None) -> None:
        results[key] = {"slotq": report}
        text.extend(["", *lines])
        targets.extend(f"- {'PASS' if ok else 'MISS'} {name}: {detail}" for name, ok, detail in checks or [])
        lap(key)

    if want("waiters"):
        import memory

        # --quick: one line in each kind of pool (a line is about 40 s, most
        # of it the 30 s window), the two-slot one past inotify's 128.
        r = memory.run((100,), two_slots=300, windows=1) if args.quick else memory.run((100, 1000))
        own("waiters", r, memory.format_waiters(r), memory.targets(r))
    if want("remote"):
        import remote

        r = remote.run(5 if args.quick else 15, large=True)
        own("remote", r, remote.format_remote(r), remote.targets(r))
    if want("binding"):
        import binding

        r = binding.run(30 if args.quick else 60)
        own("binding", r, binding.format_binding(r), binding.targets(r))
    if want("slurm"):
        import slurm

        r = slurm.run(2 if args.quick else 5)
        own("slurm", r, slurm.format_slurm(r), slurm.targets(r))
    if want("mcp"):
        import mcpcall

        r = mcpcall.run(10 if args.quick else 30)
        own("mcp", r, mcpcall.format_mcp(r))
    if want("history"):
        import history

        r = history.run(200_000 if args.quick else 1_000_000)
        own("history", r, history.format_history(r))
        r = history.scrape()
        own("scrape", r, history.format_scrape(r),
            [("slotq metrics on 100,000 runs within 1 s", float(r["metrics_ms"]) < 1000,  # type: ignore[arg-type]
              f"{r['metrics_ms']} ms (its first, the index built: {r['metrics_first_ms']} ms)")])
    if want("chaos"):
        # --quick: one chaos run (about a minute each; a slow VM took 9.5 of
        # the 10 minutes --quick may take with two).
        report = chaos(args.chaos_callers, 1 if args.quick else 3)
        own("chaos", report, format_chaos(report))
    return text, targets


def write_report(report: str, data: dict[str, object], out: Path) -> None:
    print(report)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"bench-{stamp}.md").write_text(report + "\n")
    (out / f"bench-{stamp}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "latest.md").write_text(report + "\n")
    print(f"\nwritten: {out / f'bench-{stamp}.md'}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
