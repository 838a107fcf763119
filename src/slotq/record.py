"""The run record: the one shape in which slotq tells how a run went --
`slotq run --json`, `slotq attach --json`, `slotq history --json`, the
Python API's `RunResult.to_dict()` and the MCP server's results. Its JSON
Schema is docs/schema/run-record.json; every field is documented there,
once. `schema_version` changes only when a field changes meaning or goes;
new fields may come without it.

A history line on disk is older than this record and keeps its own names
(its `exit_code` is the command's own code): `from_history` turns one,
of any version, into the record."""

from __future__ import annotations

SCHEMA_VERSION = 1

# In this order; a history record adds `user`, `pool`, `kept` (a kept run's
# lease) and `recorded_by` (a line written by another user).
FIELDS = ("schema_version", "outcome", "blame", "exit_code", "command_exit_code", "run_id", "label", "class", "host",
          "slot", "ticket", "budget", "message", "phases", "waited_s", "ran_s", "transfer_s", "transport")
HISTORY_EXTRA = ("user", "pool", "kept", "recorded_by")


def from_history(line: dict[str, object]) -> dict[str, object]:
    """A history record (history.clean_record's or the index's: its
    `exit_code` is the command's) as a run record. One that is a record
    already (a newer slotq's `history --json`, read over ssh) is kept."""
    if line.get("schema_version") == SCHEMA_VERSION:
        return line
    from .outcome import Outcome, exit_code_for

    code = line.get("exit_code")
    command_code = code if isinstance(code, int) and not isinstance(code, bool) else None
    try:
        outcome: Outcome | None = Outcome(str(line.get("outcome")))
    except ValueError:
        outcome = None
    record: dict[str, object] = {
        "schema_version": SCHEMA_VERSION, "outcome": line.get("outcome"),
        "blame": outcome.blame if outcome is not None else None,
        "exit_code": exit_code_for(outcome, command_code) if outcome is not None else None,
        "command_exit_code": command_code,
        "transfer_s": None, "transport": None,  # the caller's to know: not in the host's history
    }
    for key in FIELDS:
        if key not in record:
            record[key] = line.get(key)
    for key in HISTORY_EXTRA:
        if key in line:
            record[key] = line[key]
    return record
