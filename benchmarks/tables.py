"""The side-by-side table and the targets of bench.py's report."""

from __future__ import annotations

import os


def fmt(v: object, key: str) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    if key in ("inversions", "overlap", "overlaps", "queue_inversions"):
        return f"{v:g}"
    if key == "cpu_s":
        return f"{v:.3f}"
    if key == "per_s":
        return f"{v:.1f}"
    if key == "x_python":
        return f"{v:.2f}x"
    return f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"


def table(results: dict[str, dict[str, dict[str, object]]], tools: list[str]) -> str:
    rows = [("scenario", "metric", *tools, "slotq / flock")]
    for scenario, per_tool in results.items():
        keys = [k for k in next((v for v in per_tool.values() if "n" in v), {}) if
                k not in ("n", "note") and not k.endswith(("_min", "_max"))]
        for key in keys:
            cells = []
            for t in tools:
                e = per_tool.get(t, {})
                if key in e:
                    spread = f" [{fmt(e[key + '_min'], key)}–{fmt(e[key + '_max'], key)}]" if int(e.get("n", 0)) > 1 else ""  # type: ignore[call-overload]
                    cells.append(fmt(e[key], key) + spread)
                else:
                    cells.append("n/a" if "note" in e else "-")
            s, f = per_tool.get("slotq", {}).get(key), per_tool.get("flock", {}).get(key)
            ratio = f"{s / f:.2f}x" if isinstance(s, (int, float)) and isinstance(f, (int, float)) and f else "-"
            t = per_tool.get("task-spooler", {}).get(key)
            if ratio == "-" and isinstance(s, (int, float)) and isinstance(t, (int, float)) and t:
                ratio = f"{s / t:.2f}x tsp"  # a scenario flock has no part in (comeback)
            rows.append((scenario, key, *cells, ratio))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
        if j == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def check_targets(results: dict[str, dict[str, dict[str, object]]]) -> list[str]:
    def val(s: str, t: str, k: str) -> float | None:
        v = results.get(s, {}).get(t, {}).get(k)
        return float(v) if isinstance(v, (int, float)) else None

    lines_: list[str] = []

    def target(name: str, ok: bool | None, detail: str) -> None:
        mark = "n/a " if ok is None else ("PASS" if ok else "MISS")
        lines_.append(f"- {mark} {name}: {detail}")

    # The "handoff p50" read two ways: the first waiter's start after
    # the release (one sample per repetition, median over repetitions), and
    # the median gap between successive starts (N-1 hand-overs per run).
    # The targets as restated (a line of short commands is CPU-bound on two
    # cores): 1.5x flock at N=50, 2x at N=500 and 1000, and slotq's CPU per
    # hand-over within 3.5x flock's (docs/performance.md).
    for n, limit in ((50, 1.5), (500, 2.0), (1000, 2.0)):
        for key, what in (("latency_ms", "first start after release"), ("gap_ms", "successive hand-overs")):
            if n == 1000 and key == "latency_ms":
                continue  # the target at N = 1000 is the gap (issue 15)
            s, f = val(f"handoff N={n}", "slotq", key), val(f"handoff N={n}", "flock", key)
            ok = None if s is None or f is None else s <= limit * max(f, 0.001)
            target(f"handoff p50 at N={n} within {limit}x flock ({what})", ok,
                   f"slotq {fmt(s, 'ms')} ms vs flock {fmt(f, 'ms')} ms"
                   + (f" ({s / f:.2f}x)" if s is not None and f else ""))
    s, f = val("handoff N=1000", "slotq", "cpu_ms"), val("handoff N=1000", "flock", "cpu_ms")
    target("CPU per hand-over at N=1000 within 3.5x flock's", None if s is None or f is None else s <= 3.5 * f,
           f"slotq {fmt(s, 'ms')} ms vs flock {fmt(f, 'ms')} ms" + (f" ({s / f:.2f}x)" if s and f else ""))
    if s is not None and f is not None:
        cores = os.cpu_count() or 1
        lines_.append(f"  (N=1000: the machine's CPU per hand-over, the commands' own included, slotq {s:.1f} ms, "
                      f"flock {f:.1f} ms; on {cores} cores a line this long needs about "
                      f"{s / cores:.1f} ms between slotq's hand-overs)")
    c = val("idle 50 waiters / 20 s", "slotq", "cpu_s")
    target("idle CPU of 50 waiters over 20 s <= 0.02 s", None if c is None else c <= 0.02, f"slotq {fmt(c, 'cpu_s')} s")
    inv = val("order 20 callers", "slotq", "inversions_max")
    target("zero order inversions", None if inv is None else inv == 0,
           f"slotq: inversions in the worst repetition: {fmt(inv, 'inversions')}")
    qinv = val("order 20 callers", "slotq", "queue_inversions_max")
    lines_.append(f"  (slotq's start order against its ticket order, worst repetition: {fmt(qinv, 'inversions')} "
                  "inversions; arrival is when the bench starts the process, the ticket ~15 ms later; the line is read "
                  "from the host's ticket numbers before the holder lets go)")
    ovl = val("order 20 callers", "slotq", "overlaps_max")
    target("never two commands in the one slot at once", None if ovl is None else ovl == 0,
           f"slotq: overlapping starts in the worst repetition: {fmt(ovl, 'overlaps')}")
    pc, py, x, pys = (val("per-call overhead", "slotq", k) for k in ("ms", "python_ms", "x_python", "python_S_ms"))
    target("per call within 2x a bare interpreter start", None if x is None else x <= 2,
           f"slotq {fmt(pc, 'ms')} ms vs `python -c pass` {fmt(py, 'ms')} ms, paired ({x:.2f}x)" if x else "-")
    if pys is not None and py is not None:
        lines_.append(f"  (slotq's launcher starts without site, which is {py - pys:.1f} ms of that bare start: "
                      f"`python -S -c pass` {fmt(pys, 'ms')} ms, paired)")
    ts, tsem = val("throughput 200 cmds / 2 slots", "slotq", "per_s"), val("throughput 200 cmds / 2 slots", "sem", "per_s")
    target("throughput at least 5x sem's", None if ts is None or tsem is None else ts >= 5 * tsem,
           f"slotq {fmt(ts, 'per_s')}/s vs sem {fmt(tsem, 'per_s')}/s")
    ov = val("crash handoff", "slotq", "overlap")
    target("no handoff while a dead holder's command runs", None if ov is None else ov == 0,
           f"slotq overlap in {fmt(ov, 'overlap')} of the runs (median)")
    ch = results.get("chaos", {}).get("slotq")
    if ch:
        holds = ch["longest_hold_s"]
        assert isinstance(holds, dict)
        worst = max(holds.values(), default=0.0)
        bad = sum(int(ch[k]) for k in ("overlaps", "fifo_inversions", "survivors_not_as_expected",  # type: ignore[call-overload]
                                       "stale_tickets", "orphan_groups", "killed_without_history"))
        target("chaos: no overlap, FIFO kept, survivors as expected, nothing stale, orphaned or unrecorded", bad == 0,
               f"{bad} violation(s) over {ch['runs']} runs of {ch['callers']} callers")
        target("chaos: no slot held past budget + grace + 2 s", worst <= float(ch["hold_limit_s"]),  # type: ignore[arg-type]
               f"longest hold {worst} s (limit {ch['hold_limit_s']} s)")
    return lines_
