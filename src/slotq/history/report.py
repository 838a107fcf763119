"""`slotq report --html`: a timeline of a host's runs, one self-contained
HTML file (no network: the data, the style and the script are inline).

The page shows one lane per slot with each run as a bar coloured by outcome
(hover: label, user, waited, ran, exit), each run's wait (submitted -> slot)
as a thin bar before it (runs that never got a slot in a lane of their
pool's own), the queue length over time, and per pool: p50/p95 wait,
utilisation per slot, runs per outcome.

The runs travel as compact JSON (times in tenths of a second from the
window's start, names deduplicated), so 10,000 runs make a few hundred KB;
the page's script draws them into an SVG.
"""

from __future__ import annotations

import html
import json

OUTCOME_COLORS = {
    "passed": "#2e7d32", "failed": "#c62828", "exec_timeout": "#ef6c00", "idle_timeout": "#f9a825",
    "backstop": "#6a1b9a", "unavailable": "#8e24aa", "prepare_failed": "#ad1457", "cancelled": "#757575",
    "caller_gone": "#9e9e9e", "not_admitted": "#455a64", "budget_exhausted": "#5d4037", "deadline": "#5d4037",
}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def build(runs: list[dict[str, object]], since: float, until: float, host: str) -> dict[str, object]:
    """The page's data and summary from history rows (history.index's). The
    time axis spans the runs' own extent within [since, until] (a day's
    window with an hour of runs shows the hour); utilisation is over it."""
    times = [float(v) for r in runs for v in r["phases"].values()  # type: ignore[attr-defined]
             if isinstance(v, (int, float))]
    if times:
        pad = max(1.0, (max(times) - min(times)) * 0.01)
        since, until = max(since, min(times) - pad), min(until, max(times) + pad)
    lanes: list[str] = []
    lane_of: dict[str, int] = {}
    users: list[str] = []
    labels: list[str] = []
    outcomes = list(OUTCOME_COLORS)
    idx: dict[str, dict[str, int]] = {"user": {}, "label": {}}

    def intern(kind: str, table: list[str], value: object) -> int:
        text = str(value or "")
        if text not in idx[kind]:
            idx[kind][text] = len(table)
            table.append(text)
        return idx[kind][text]

    def t(v: object) -> int | None:
        return None if not isinstance(v, (int, float)) else int(round((v - since) * 10))

    rows = []
    queue_events: list[tuple[float, int]] = []
    per_pool: dict[str, dict[str, object]] = {}
    for r, lane_name in zip(runs, _lanes(runs)):
        ph: dict[str, object] = r["phases"]  # type: ignore[assignment]
        pool = str(r.get("pool") or r.get("class") or "?")
        if lane_name not in lane_of:
            lane_of[lane_name] = len(lanes)
            lanes.append(lane_name)
        outcome = str(r.get("outcome") or "unavailable")
        if outcome not in outcomes:
            outcomes.append(outcome)
        sub, got, start, end = ph.get("submitted"), ph.get("slot"), ph.get("started"), ph.get("ended")
        # Times: the first known absolute, the others as steps from the one
        # before (null when never reached): short numbers, a small page.
        prev: int | None = None
        coded: list[int | None] = []
        for v in (t(sub), t(got), t(start), t(end)):
            coded.append(None if v is None else (v if prev is None else v - prev))
            prev = v if v is not None else prev
        rows.append([*coded, lane_of[lane_name], outcomes.index(outcome), intern("user", users, r.get("user")),
                     intern("label", labels, r.get("label")), r.get("exit_code"), r.get("kept")])
        if isinstance(sub, (int, float)) and isinstance(end, (int, float)):
            left = got if isinstance(got, (int, float)) else end
            queue_events += [(float(sub), 1), (float(left), -1)]
        p = per_pool.setdefault(pool, {"waits": [], "ran": {}, "outcomes": {}, "runs": 0})
        p["runs"] = int(p["runs"]) + 1  # type: ignore[call-overload]
        if isinstance(r.get("waited_s"), (int, float)):
            p["waits"].append(float(r["waited_s"]))  # type: ignore[arg-type, attr-defined]
        if r.get("slot") and isinstance(start, (int, float)) and isinstance(end, (int, float)):
            busy = max(0.0, min(float(end), until) - max(float(start), since))
            ran: dict[str, float] = p["ran"]  # type: ignore[assignment]
            ran[lane_name] = ran.get(lane_name, 0.0) + busy
        counts: dict[str, int] = p["outcomes"]  # type: ignore[assignment]
        counts[outcome] = counts.get(outcome, 0) + 1
    return {"host": host, "since": since, "until": until, "lanes": lanes, "users": users, "labels": labels,
            "outcomes": outcomes, "colors": [OUTCOME_COLORS.get(o, "#000") for o in outcomes], "runs": rows,
            "queue": _queue_curve(queue_events, since), "summary": _summary(per_pool, since, until)}


def _queue_curve(events: list[tuple[float, int]], since: float) -> list[list[int]]:
    """How many waited, as [tenths of a second from `since`, depth] at each
    change (one point per tenth)."""
    queue: list[list[int]] = []
    depth = 0
    for at, step in sorted(events):
        depth += step
        point = [int(round((at - since) * 10)), depth]
        if queue and queue[-1][0] == point[0]:
            queue[-1] = point
        else:
            queue.append(point)
    return queue


def _summary(per_pool: dict[str, dict[str, object]], since: float, until: float) -> list[dict[str, object]]:
    """Per pool: runs, wait percentiles, each slot's utilisation, outcomes."""
    span = max(until - since, 1e-9)
    summary = []
    for pool, p in sorted(per_pool.items()):
        waits: list[float] = p["waits"]  # type: ignore[assignment]
        ran: dict[str, float] = p["ran"]  # type: ignore[assignment]
        summary.append({"pool": pool, "runs": p["runs"],
                        "wait_p50_s": _pct(waits, 0.5), "wait_p95_s": _pct(waits, 0.95),
                        "utilisation": {slot: round(busy / span, 4) for slot, busy in sorted(ran.items())},
                        "outcomes": dict(sorted(p["outcomes"].items()))})  # type: ignore[attr-defined]
    return summary


def _lanes(runs: list[dict[str, object]]) -> list[str]:
    """Each run's lane: its slot's; a run that got none, its pool's `(no
    slot)` lane. A Slurm job's slot is its own allocation, so a lane each
    would make a thousand jobs a thousand lanes: they go in their node's
    lanes instead, as few as the runs that ran there at once need (`node1
    (Slurm) #0`, `#1`, ...; each run in the first lane free when it got its
    allocation)."""
    def when(r: dict[str, object], *keys: str) -> float:
        ph: dict[str, object] = r["phases"] or {}  # type: ignore[assignment]
        return next((float(v) for k in keys if isinstance(v := ph.get(k), (int, float))), 0.0)

    names = [str(r["slot"]) if r.get("slot") else f"{r.get('pool') or r.get('class') or '?'} (no slot)"
             for r in runs]
    busy_until: dict[str, list[float]] = {}  # node -> when each of its lanes is free again
    jobs = [i for i, name in enumerate(names) if name.startswith("slurm job ")]
    for i in sorted(jobs, key=lambda i: when(runs[i], "slot", "started", "ended")):
        node = str(runs[i].get("host") or "slurm")
        lanes = busy_until.setdefault(node, [])
        start, end = when(runs[i], "slot", "started", "ended"), when(runs[i], "ended")
        k = next((k for k, free in enumerate(lanes) if free <= start), len(lanes))
        lanes[k:k + 1] = [end]
        names[i] = f"{node} (Slurm) #{k}"
    return names


def _fmt(s: object) -> str:
    from ..durations import format_duration

    return "-" if not isinstance(s, (int, float)) else format_duration(float(s))


def render_html(data: dict[str, object]) -> str:
    import time

    def when(v: object) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(float(v)))  # type: ignore[arg-type]

    rows = []
    for s in data["summary"]:  # type: ignore[attr-defined]
        util = ", ".join(f"{html.escape(k)} {v * 100:.0f}%" for k, v in s["utilisation"].items()) or "-"
        outs = ", ".join(f"{html.escape(k)} {v}" for k, v in s["outcomes"].items())
        rows.append(f"<tr><td>{html.escape(str(s['pool']))}</td><td>{s['runs']}</td>"
                    f"<td>{_fmt(s['wait_p50_s'])}</td><td>{_fmt(s['wait_p95_s'])}</td><td>{util}</td>"
                    f"<td>{outs}</td></tr>")
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{html.escape(o)}</span>'
                     for o, c in zip(data["outcomes"], data["colors"])  # type: ignore[call-overload]
                     if any(r[5] == data["outcomes"].index(o) for r in data["runs"]))  # type: ignore[attr-defined]
    # Inside <script> the HTML parser acts on "</script" and "<!--" (which
    # can make it swallow the rest of the page): a label from any user of a
    # shared state dir may hold either. JSON may spell every "<" as \u003c.
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    title = f"slotq runs on {data['host']}, {when(data['since'])} – {when(data['until'])}"
    return _PAGE.format(title=html.escape(title), rows="".join(rows), legend=legend, payload=payload,
                        count=len(data["runs"]))  # type: ignore[arg-type]


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 16px; margin: 0 0 8px; }}
table {{ border-collapse: collapse; margin: 8px 0 12px; }}
td, th {{ border: 1px solid #ddd; padding: 3px 8px; text-align: left; }}
th {{ background: #f5f5f5; }}
.key {{ margin-right: 12px; white-space: nowrap; }}
.key i {{ display: inline-block; width: 10px; height: 10px; margin-right: 4px; }}
#chart {{ overflow-x: auto; border: 1px solid #ddd; }}
svg text {{ font-size: 11px; fill: #444; }}
rect.wait {{ fill: #90caf9; }}
rect.run {{ stroke: #fff; stroke-width: 0.6; }}
rect.run[data-thin] {{ stroke: none; }}
rect.run:hover {{ stroke: #000; stroke-width: 1; }}
#tip {{ position: fixed; pointer-events: none; background: #fff; border: 1px solid #999; padding: 4px 6px;
        box-shadow: 0 1px 4px rgba(0,0,0,.2); display: none; white-space: pre; }}
</style></head>
<body>
<h1>{title}</h1>
<p>{count} run(s). Each bar is a run in its slot, coloured by outcome; the thin light blue bar before it is its
wait (submitted → slot), drawn under the lane. Hover a bar for details. Below the lanes: runs waiting in line over time.</p>
<div>{legend}<span class="key"><i style="background:#90caf9"></i>waiting</span></div>
<table><tr><th>pool</th><th>runs</th><th>wait p50</th><th>wait p95</th><th>utilisation per slot (of the span shown)</th>
<th>runs per outcome</th></tr>{rows}</table>
<div id="chart"></div><div id="tip"></div>
<script id="data" type="application/json">{payload}</script>
<script>
(function () {{
  "use strict";
  var d = JSON.parse(document.getElementById("data").textContent);
  var NS = "http://www.w3.org/2000/svg", laneH = 26, top = 24, left = 130, width = 1100;
  var span = Math.max(1, Math.round((d.until - d.since) * 10));
  var qH = 80, height = top + d.lanes.length * laneH + 20 + qH + 20;
  var x = function (t) {{ return left + (Math.max(0, Math.min(span, t)) / span) * width; }};
  var svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", left + width + 50); svg.setAttribute("height", height);
  function el(name, attrs, parent) {{
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    (parent || svg).appendChild(e); return e;
  }}
  function two(v) {{ return String(v).padStart(2, "0"); }}
  function fmt(s) {{
    if (s === null || s === undefined) return "-";
    if (s < 1) return Math.round(s * 1000) + "ms";
    if (s < 60) return s.toFixed(1) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  }}
  for (var i = 0; i <= 10; i++) {{
    var tx = x(span * i / 10);
    el("line", {{x1: tx, x2: tx, y1: top - 4, y2: height - 20, stroke: "#eee"}});
    var lt = el("text", {{x: tx, y: 14, "text-anchor": "middle"}});
    var at = new Date((d.since + span * i / 100) * 1000);
    // Past half a day, the day too (MM-DD HH:MM): a day's ticks would repeat.
    lt.textContent = span > 432000 ? two(at.getMonth() + 1) + "-" + two(at.getDate()) + " " + two(at.getHours()) +
      ":" + two(at.getMinutes()) : [at.getHours(), at.getMinutes(), at.getSeconds()].map(two).join(":");
  }}
  d.lanes.forEach(function (name, i) {{
    var t = el("text", {{x: 4, y: top + i * laneH + 15}}); t.textContent = name;
    el("line", {{x1: left, x2: left + width, y1: top + (i + 1) * laneH, y2: top + (i + 1) * laneH, stroke: "#f0f0f0"}});
  }});
  var bars = el("g", {{}});
  d.runs.forEach(function (r) {{  // decode the steps into times (tenths of a second from the start)
    var prev = null;
    for (var k = 0; k < 4; k++) if (r[k] !== null) {{ r[k] = prev === null ? r[k] : prev + r[k]; prev = r[k]; }}
  }});
  d.runs.forEach(function (r, n) {{
    var sub = r[0], got = r[1], start = r[2], end = r[3], y = top + r[4] * laneH;
    var from = (start !== null ? start : (got !== null ? got : sub));
    if (sub !== null) {{
      var wEnd = got !== null ? got : end;
      el("rect", {{"class": "wait", x: x(sub), y: y + laneH - 6, width: Math.max(1, x(wEnd) - x(sub)), height: 3}},
         bars);
    }}
    var b = el("rect", {{"class": "run", x: x(from), y: y + 2, height: laneH - 9,
                        width: Math.max(2, x(end) - x(from)), fill: d.colors[r[5]], "data-i": n}}, bars);
    // A bar of a few pixels or less has no white outline: the outlines of
    // a busy slot's many short runs would paint its lane white.
    if (x(end) - x(from) < 4) b.setAttribute("data-thin", "");
    if (got === null) b.setAttribute("opacity", "0.5");
  }});
  var qTop = top + d.lanes.length * laneH + 20, qMax = 1;
  d.queue.forEach(function (p) {{ qMax = Math.max(qMax, p[1]); }});
  var qy = function (v) {{ return qTop + qH - v / qMax * qH; }};
  // One pixel column at a time, at the most that waited in it: a line that
  // changes many times within a pixel (a busy day) reads as its peaks,
  // not as a solid band between its lowest and highest.
  var path = "M" + left + "," + qy(0), level = 0, col = null, high = 0;
  function column(next) {{  // up to this column's peak; down to where it ended only if a quiet stretch follows
    path += " H" + col + " V" + qy(high);
    if (next > col + 1) path += " H" + (col + 1) + " V" + qy(level);
  }}
  d.queue.forEach(function (p) {{
    var c = Math.floor(x(p[0]));
    if (c !== col) {{ if (col !== null) column(c); col = c; high = level; }}
    level = p[1]; high = Math.max(high, level);
  }});
  if (col !== null) column(Infinity);
  path += " H" + (left + width);
  el("path", {{d: path, fill: "none", stroke: "#1565c0", "class": "queue", "shape-rendering": "crispEdges"}});
  el("line", {{x1: left, x2: left + width, y1: qy(0), y2: qy(0), stroke: "#999"}});
  var ql = el("text", {{x: 4, y: qTop + 12}}); ql.textContent = "waiting (max " + qMax + ")";
  document.getElementById("chart").appendChild(svg);
  var tip = document.getElementById("tip");
  svg.addEventListener("mousemove", function (ev) {{
    var i = ev.target.getAttribute && ev.target.getAttribute("data-i");
    if (i === null || i === undefined) {{ tip.style.display = "none"; return; }}
    var r = d.runs[+i];
    tip.textContent = (d.labels[r[7]] || "(no label)") + "\\nuser " + (d.users[r[6]] || "?") + "  " +
      d.outcomes[r[5]] + (r[8] !== null ? " (exit " + r[8] + ")" : "") + "\\nwaited " + fmt(r[0] === null ? null : ((r[1] !== null ? r[1] : r[3]) - r[0]) / 10) +
      ", ran " + fmt(r[2] === null ? null : (r[3] - r[2]) / 10) +
      "\\nslot " + d.lanes[r[4]] + (r[9] ? "\\nkept run (lease " + fmt(r[9]) + ")" : "");
    tip.style.display = "block"; tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
  }});
  svg.addEventListener("mouseleave", function () {{ tip.style.display = "none"; }});
  document.body.setAttribute("data-ready", "1");
}})();
</script>
</body></html>
"""
