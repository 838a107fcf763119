"""The lines a waiting run shows: its place in line, who holds the slot,
the load and the ETA (`slotq run`'s report every --report-every, or a
terminal's one live line), and a pending Slurm job's place in Slurm's
line. Loaded only by a run that waits and shows its waiting."""

from __future__ import annotations

from ..durations import format_duration, seconds_in


def format_queued(ev: dict[str, object], compact: bool = False, others_as_data: bool = False) -> str:
    """One status line for a `queued` event; `compact`: the short form of
    a terminal's live line (waited, position, holder and how long, ETA).
    `others_as_data`: for a model to read (the MCP server's progress): what
    other users wrote -- their runs' labels, their processes' names, the
    ETA's words that name labels, notes -- is left out; each holder is "a
    run of user U". Other users' text is data, never instructions."""
    from ..records import printable

    slurm = ev.get("slurm")
    if isinstance(slurm, dict):
        return format_pending(seconds_in(ev.get("waited_s")), slurm, others_as_data)
    if compact:
        return _compact_queued(ev)
    if others_as_data:
        return _queued_as_data(ev)
    parts = [f"waiting {format_duration(seconds_in(ev.get('waited_s')))}",
             f"position {printable(ev.get('position'))} in pool {printable(ev.get('pool'))} "
             f"({printable(ev.get('ahead'))} ahead)"]
    parts += _drained(ev)
    held = [h for h in ev.get("holders") or [] if isinstance(h, dict) and h.get("held")]  # type: ignore[attr-defined]
    live = [h for h in held if h.get("phase") != "orphaned"]
    if live:
        desc = ", ".join(
            (f"{printable(h.get('label') or '?')} (user {printable(h.get('user') or '?')}) "
             f"for {format_duration(seconds_in(h.get('held_s')))}" if h.get("phase") not in ("no record", "starting")
             else f"{printable(h.get('lock_holders') or '?')} "
             + ("(starting)" if h.get("phase") == "starting" else "with no slotq record"))
            + (" (stopping)" if h.get("phase") == "stopping" else "") for h in live)
        parts.append(f"slot held by {desc}")
    if len(live) < len(held):
        from ..host.status import describe_orphan

        parts += [describe_orphan(h) for h in held if h.get("phase") == "orphaned"]
    if ev.get("eta_how"):
        from ..history.eta import eta_words

        parts.append(f"expected wait {eta_words(ev.get('eta_s'), ev.get('eta_max_s'))} "
                     f"({printable(ev.get('eta_how'), 200)})")
    parts.append(f"load {printable(ev.get('load1'))}/{printable(ev.get('cores'))} cores")
    notes = ev.get("notes")
    if isinstance(notes, list):
        parts += [printable(n, 500) for n in notes]
    return "slotq: " + "; ".join(parts)


def _queued_as_data(ev: dict[str, object]) -> str:
    from ..records import printable

    parts = [f"waiting {format_duration(seconds_in(ev.get('waited_s')))}",
             f"position {printable(ev.get('position'))} in pool {printable(ev.get('pool'), 64)} "
             f"({printable(ev.get('ahead'))} ahead)"]
    parts += _drained(ev)
    held = [h for h in ev.get("holders") or [] if isinstance(h, dict) and h.get("held")]  # type: ignore[attr-defined]
    if held:
        parts.append("slot held by " + ", ".join(
            f"a run of user {printable(h.get('user') or '?', 32)} for {format_duration(seconds_in(h.get('held_s')))}"
            for h in held))
    if ev.get("eta_how"):
        from ..history.eta import eta_words

        parts.append(f"expected wait {eta_words(ev.get('eta_s'), ev.get('eta_max_s'))}")
    parts.append(f"load {printable(ev.get('load1'))}/{printable(ev.get('cores'))} cores")
    return "slotq: " + "; ".join(parts)


def _drained(ev: dict[str, object]) -> list[str]:
    """The pool's drain, if its owner drained it (host/drain.py): the
    wait is the infrastructure's, and this says whose and why."""
    d = ev.get("drained")
    if not isinstance(d, dict):
        return []
    from ..host.drain import describe

    return [describe(ev.get("pool"), d)]


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _compact_queued(ev: dict[str, object]) -> str:
    from ..records import printable

    parts = [f"waiting {format_duration(seconds_in(ev.get('waited_s')))}",
             f"#{printable(ev.get('position'))} in {printable(ev.get('pool'))}"]
    drained = ev.get("drained")
    if isinstance(drained, dict):
        parts.append(f"pool drained by {printable(drained.get('by'), 16)}")
    held = [h for h in ev.get("holders") or [] if isinstance(h, dict) and h.get("held")]  # type: ignore[attr-defined]
    if held:
        h = min(held, key=lambda h: -seconds_in(h.get("held_s")))
        more = f" +{len(held) - 1}" if len(held) > 1 else ""
        parts.append(f"slot: {printable(h.get('label') or '?', 30)} ({printable(h.get('user') or '?', 16)}) "
                     f"{format_duration(seconds_in(h.get('held_s')))}{more}")
    if _number(ev.get("eta_s")):
        parts.append(f"ETA ~{format_duration(seconds_in(ev.get('eta_s')))}")
    elif _number(ev.get("eta_max_s")):
        parts.append(f"ETA ≤{format_duration(seconds_in(ev.get('eta_max_s')))}")
    return "slotq: " + " · ".join(parts)


def format_pending(waited: float, view: dict[str, object], others_as_data: bool = False) -> str:
    """One status line for a pending Slurm job (transports/slurm/'s
    pending_view): position in Slurm's priority order, Slurm's reason, who
    holds the partition, the expected start. `others_as_data`: without the
    holders' job names and labels (format_queued)."""
    from ..records import printable

    parts = [f"waiting {format_duration(waited)}",
             f"position {printable(view.get('position'))} of {printable(view.get('pending'))} pending in "
             f"partition {printable(view.get('partition'))} (Slurm job {printable(view.get('job_id'))}, "
             f"reason {printable(view.get('reason'))})"]
    holders = [h for h in view.get("holders") or [] if isinstance(h, dict)]  # type: ignore[attr-defined]
    if holders:
        parts.append("held by " + ", ".join(
            f"job {printable(h.get('job_id'))} "
            + ("" if others_as_data else f"{printable(h.get('label') or h.get('name'), 60)} ")
            + f"(user {printable(h.get('user'))}) "
            f"for {printable(h.get('elapsed'))}" for h in holders[:5]) + (
            f" and {len(holders) - 5} more" if len(holders) > 5 else ""))
    if view.get("expected_start"):
        parts.append(f"Slurm expects it to start at {printable(view.get('expected_start'))}")
    return "slotq: " + "; ".join(parts)
