"""The run record: the one shape in which slotq tells how a run went --
`slotq run --json`, `slotq attach --json`, `slotq history --json`, the
Python API's `RunResult.to_dict()` and the MCP server's results.

Its fields are defined here, once: `FIELDS`, each with its JSON types, its
meaning, when it is set and the name a host's history line keeps it under.
Everything else is made from this list or checked against it by a test
(tests/test_record.py): the JSON Schema docs/schema/run-record.json is
`python -m slotq.record` (a test compares them), the MCP tools' output
schema is `properties()`, the history line's keys (`history.run_record`)
and the history index's columns are checked against it, and the same run
read every way (live, attach, history, MCP, Python) is compared field by
field. `schema_version` changes only when a field changes meaning or goes;
new fields may come without it.

A history line on disk keeps its own names (its `exit_code` is the
command's own code): `from_history` turns one, of any version, into the
record."""

from __future__ import annotations

SCHEMA_VERSION = 1

# The phases, in the order a run passes them (epoch seconds, the host's
# clock; `transferred` the caller's, a remote run's only). A host's history
# line has all but `transferred`.
PHASES = ("submitted", "transferred", "slot", "prepared", "started", "ended")
HOST_PHASES = tuple(p for p in PHASES if p != "transferred")


class Field:
    """One field: its JSON `types`, its `meaning`, the phase it is `set_at`
    ("reader": made from other fields when read), its name in a host's
    history `line` (None: not written there), and whether it is only in
    `history --json` (and the history index)."""

    __slots__ = ("name", "types", "meaning", "set_at", "line", "history_only")

    def __init__(self, name: str, types: tuple[str, ...], meaning: str, set_at: str, line: str | None,
                 history_only: bool = False) -> None:
        self.name, self.types, self.meaning, self.set_at = name, types, meaning, set_at
        self.line, self.history_only = line, history_only


FIELDS: tuple[Field, ...] = (
    Field("schema_version", ("integer",), "this record's version: 1", "reader", None),
    Field("outcome", ("string",), "how the run ended (slotq run --help: outcomes and exit codes); "
          "detached: not ended, its caller left a kept run", "ended", "outcome"),
    Field("blame", ("string",), "whose the ending is: work (the command), infrastructure (no slot, no host, "
          "no result), caller (cancelled, gone), task (an outer deadline or budget), none (not ended)",
          "reader", None),
    Field("exit_code", ("integer",), "what slotq exits with for this run: the command's own code for "
          "passed/failed, else the outcome's fixed code", "reader", None),
    Field("command_exit_code", ("integer", "null"), "the command's own exit code (128 + N: killed by signal N); "
          "null if it never ran or its end is unknown", "ended", "exit_code"),
    Field("run_id", ("string",), "the run's id (letters and digits, at most 64)", "submitted", "run_id"),
    Field("label", ("string", "null"), "the run's label (default: user: command)", "submitted", "label"),
    Field("class", ("string", "null"), "the run's class (shared, landing, or the host's own)", "submitted",
          "class"),
    Field("host", ("string", "null"), "the host it ran (or waited) on", "submitted", "host"),
    Field("slot", ("string", "null"), "the slot it held, e.g. shared#0; null if it never had one", "slot", "slot"),
    Field("ticket", ("integer", "null"), "its number in the host's line (the order the queue keeps); null if "
          "it never joined one", "submitted", "ticket"),
    Field("budget", ("number", "null"), "the command's run-time limit, seconds, counted from its start",
          "submitted", "budget"),
    Field("message", ("string", "null"), "the ending in words", "ended", "message"),
    Field("phases", ("object", "null"), "when each phase began (epoch seconds), null when never reached: "
          "submitted (by its caller), transferred (a remote run's work tree there, on the caller's clock; a "
          "late-bound run's after its slot), slot, prepared (its --prepare step passed), started, ended",
          "submitted", "phases"),
    Field("waited_s", ("number", "null"), "time before the slot: submitted -> slot (-> the end, for a run "
          "that never got one); a remote run's transfer is part of it", "slot", "waited_s"),
    Field("ran_s", ("number", "null"), "the command's run time: started -> ended", "ended", "ran_s"),
    Field("transfer_s", ("number", "null"), "a remote run's connection and work tree transfer, measured by the "
          "caller (null in the history)", "transferred", None),
    Field("transport", ("object", "null"), "the caller's view of how it reached the host (null in the history)",
          "transferred", None),
    Field("user", ("string", "null"), "the run's user (by the uid that wrote the line)", "reader", None, True),
    Field("pool", ("string", "null"), "the pool its class maps to", "slot", "pool", True),
    Field("kept", ("number", "null"), "a kept run's lease, seconds (slotq run --detach / --attach-for); null "
          "for other runs", "submitted", "kept", True),
    Field("recorded_by", ("string",), "the user whose file the line came from, where not the run's own",
          "reader", None, True),
)
NAMES = tuple(f.name for f in FIELDS if not f.history_only)  # every record has these, in this order
HISTORY_EXTRA = tuple(f.name for f in FIELDS if f.history_only)
LINE_KEYS = tuple(f.line for f in FIELDS if f.line is not None)  # a history line's, with its writer's "uid"

# Not the run's own, added where they apply: a Slurm run's job; the MCP
# server's output tail and what to call next.
EXTRAS: dict[str, dict[str, object]] = {
    "slurm": {"type": "object", "description": "a Slurm run's job (job_id, partition, ...)"},
    "output": {"type": "object", "description": "MCP results only: the output's tail (docs/mcp.md)"},
    "next": {"type": "string", "description": "MCP results only, for a detached run: what to call next"},
}


def waited_s(phases: dict[str, float | None]) -> float | None:
    """Time before the slot: submitted -> slot, or -> the end for a run that
    never got one (a wait cancelled in line keeps its wait)."""
    sub, slot, end = phases.get("submitted"), phases.get("slot"), phases.get("ended")
    until = slot if slot is not None else end
    return round(max(0.0, until - sub), 3) if sub is not None and until is not None else None


def ran_s(phases: dict[str, float | None]) -> float | None:
    """The command's run time: started -> ended."""
    start, end = phases.get("started"), phases.get("ended")
    return round(max(0.0, end - start), 3) if start is not None and end is not None else None


def properties() -> dict[str, dict[str, object]]:
    """Each field's JSON Schema."""
    from .outcome import BLAME, Outcome

    out: dict[str, dict[str, object]] = {}
    for f in FIELDS:
        prop: dict[str, object] = {"type": f.types[0] if len(f.types) == 1 else list(f.types),
                                   "description": ("history only: " if f.history_only else "") + f.meaning}
        if f.name == "schema_version":
            prop = {"const": SCHEMA_VERSION, "description": f.meaning}
        elif f.name == "outcome":
            prop["enum"] = [o.value for o in Outcome.members()]
        elif f.name == "blame":
            prop["enum"] = list(dict.fromkeys(BLAME.values()))
        elif f.name == "run_id":
            prop["pattern"] = "^[A-Za-z0-9]{1,64}$"
        elif f.name in ("ticket", "waited_s", "ran_s", "transfer_s"):
            prop["minimum"] = 0
        elif f.name == "phases":
            prop["properties"] = {p: {"type": ["number", "null"]} for p in PHASES}
            prop["additionalProperties"] = False
        out[f.name] = prop
    return {**out, **EXTRAS}


def schema() -> dict[str, object]:
    """docs/schema/run-record.json."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/slotq/slotq/docs/schema/run-record.json",
        "title": f"slotq run record, schema_version {SCHEMA_VERSION}",
        "description": "How one run went: slotq run --json, slotq attach --json, slotq history --json (a list of "
                       "them), the Python API's RunResult.to_dict() and the MCP server's results (which add "
                       "`output` and `next`). Times are epoch seconds (the host's clock), durations seconds. New "
                       "fields may be added without a new schema_version; one changes meaning or goes only with "
                       "a new one. Made by `python -m slotq.record` from src/slotq/record.py.",
        "type": "object",
        "required": list(NAMES),
        "properties": properties(),
    }


def from_history(line: dict[str, object]) -> dict[str, object]:
    """A history record (history.clean_record's or the index's: its
    `exit_code` is the command's) as a run record, its fields in their
    order. One that is a record already (a newer slotq's `history --json`,
    read over ssh) keeps its values."""
    if line.get("schema_version") == SCHEMA_VERSION:
        record = dict(line)
    else:
        from .outcome import Outcome, exit_code_for

        code = line.get("exit_code")
        command_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        try:
            outcome: Outcome | None = Outcome(str(line.get("outcome")))
        except ValueError:
            outcome = None
        record = {
            "schema_version": SCHEMA_VERSION, "outcome": line.get("outcome"),
            "blame": outcome.blame if outcome is not None else None,
            "exit_code": exit_code_for(outcome, command_code) if outcome is not None else None,
            "command_exit_code": command_code,
        }
        for f in FIELDS:
            if f.name not in record and (not f.history_only or f.name in line):
                record[f.name] = line.get(f.name)  # (transfer_s, transport: the caller's to know, None here)
    phases = record.get("phases")
    if isinstance(phases, dict):  # every phase named, as in a caller's record (a host's has no `transferred`)
        record["phases"] = {p: phases.get(p) for p in PHASES}
    ordered = {name: record.get(name) for name in NAMES}
    return {**ordered, **{k: v for k, v in record.items() if k not in ordered}}


if __name__ == "__main__":
    import json

    print(json.dumps(schema(), indent=2))
