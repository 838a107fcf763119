"""One run record (issue 48, item 1): `run --json`, `attach --json`,
`history --json`, the Python API and the MCP results all give the record
of docs/schema/run-record.json, with its schema_version; history lines
written before it (their `exit_code` the command's own) are read back as
that record; and one run is told alike by its caller and by the history."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Start, live_tickets, slotq_cmd, start_holder, wait_for

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "schema" / "run-record.json").read_text())
pytestmark = pytest.mark.timeout(60)


def valid(record: dict[str, Any]) -> dict[str, Any]:
    jsonschema.validate(record, SCHEMA)
    return record


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=40,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def history_json() -> list[dict[str, Any]]:
    proc = cli("history", "--json")
    assert proc.returncode == 0, proc.stderr
    return [valid(r) for r in json.loads(proc.stdout)]


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_run_attach_history_and_the_python_api_give_the_one_record(state_dir: Path, tmp_path: Path) -> None:
    passed = cli("run", "-q", "--json", "-", "--", "true")
    failed = cli("run", "-q", "--json", "-", "--", "sh", "-c", "exit 3")
    records = [valid(json.loads(p.stdout.splitlines()[-1])) for p in (passed, failed)]
    assert [(r["outcome"], r["exit_code"], r["command_exit_code"]) for r in records] == [
        ("passed", 0, 0), ("failed", 3, 3)]
    run_id = cli("run", "--detach", "--", "echo", "kept").stdout.strip()
    attached = valid(json.loads(cli("attach", run_id, "--json", "-").stdout.splitlines()[-1]))
    assert attached["run_id"] == run_id and attached["outcome"] == "passed"
    from slotq.client.caller import run
    from slotq.spec import RunSpec
    from slotq.transports.local import LocalTransport

    result = run(RunSpec(["true"]), LocalTransport())
    api = valid(result.to_dict())
    by_id = {r["run_id"]: r for r in history_json()}
    for record in (*records, attached, api):
        told = by_id[record["run_id"]]
        for key in ("outcome", "blame", "exit_code", "command_exit_code", "ticket", "budget", "slot", "class"):
            assert told[key] == record[key], (key, told, record)


def test_a_run_cancelled_in_line_is_told_alike_by_its_caller_and_the_history(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    # It was exit_code 130 / command_exit_code 143 here and 143 / null in the
    # history, and ticket and budget null for a run cancelled while waiting.
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    waiting = runs("--", "true", name="waiting")
    wait_for(lambda: "slotq: waiting" in waiting.err, what="it waits")
    waiting.proc.send_signal(signal.SIGTERM)
    assert waiting.wait() == 130
    mine = valid(waiting.result())
    assert mine["outcome"] == "cancelled" and mine["exit_code"] == 130 and mine["command_exit_code"] is None
    assert isinstance(mine["ticket"], int) and mine["budget"] == 3600.0, mine
    told = next(r for r in history_json() if r["run_id"] == mine["run_id"])
    for key in ("outcome", "blame", "exit_code", "command_exit_code", "ticket", "budget"):
        assert told[key] == mine[key], (key, told, mine)
    gate.touch()


def test_history_lines_of_the_previous_version_are_read_as_the_record(state_dir: Path) -> None:
    from slotq import history

    now = time.time()
    # As slotq wrote them before the record: exit_code the command's, no
    # ticket, budget nor schema_version.
    old = [{"run_id": "old1", "uid": 0, "label": "x", "class": "shared", "pool": "shared", "slot": "shared#0",
            "host": "h", "outcome": "cancelled", "exit_code": 143, "message": "cancelled (SIGTERM) while the "
            "command ran: stopped", "phases": {"submitted": now - 9, "slot": now - 8, "prepared": None,
                                               "started": now - 8, "ended": now - 7},
            "waited_s": 1.0, "ran_s": 1.0},
           {"run_id": "old2", "uid": 0, "label": "y", "cls": "shared", "outcome": "failed", "exit_code": 2,
            "message": "command exited 2", "phases": {"queued": now - 5, "slot": now - 5, "started": now - 5,
                                                      "ended": now - 4}}]
    state_dir.mkdir(exist_ok=True)
    for line in old:
        history.append(str(state_dir), line)
    by_id = {r["run_id"]: r for r in history_json()}
    assert (by_id["old1"]["exit_code"], by_id["old1"]["command_exit_code"]) == (130, 143)
    assert (by_id["old2"]["exit_code"], by_id["old2"]["command_exit_code"], by_id["old2"]["class"]) == (2, 2, "shared")
    assert by_id["old2"]["phases"]["submitted"] == pytest.approx(now - 5)
    assert by_id["old1"]["ticket"] is None and by_id["old1"]["schema_version"] == 1
    table = cli("history").stdout
    assert next(line for line in table.splitlines() if line.startswith("old1")).split()[-2] == "143", table


def test_status_json_follows_its_schema_and_its_runs_are_run_records(state_dir: Path, runs: Start,
                                                                      tmp_path: Path) -> None:
    from referencing import Registry, Resource

    docs = Path(__file__).resolve().parent.parent / "docs" / "schema"
    status_schema = json.loads((docs / "status.json").read_text())
    registry = Registry().with_resources([("run-record.json", Resource.from_contents(SCHEMA)),
                                          (SCHEMA["$id"], Resource.from_contents(SCHEMA))])
    assert cli("run", "-q", "--", "true").returncode == 0
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    runs("-q", "--", "true", name="waiting")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="one waiting")
    snap = json.loads(cli("status", "--json").stdout)
    validator = jsonschema.Draft202012Validator(status_schema, registry=registry)
    validator.validate(snap)
    (pool,) = [p for p in snap["pools"] if p["pool"] == "shared"]
    assert pool["slots"][0]["held"] and len(pool["waiting"]) == 1
    assert snap["history"] and all(r["schema_version"] == 1 for r in snap["history"])
    gate.touch()


def test_the_python_api_runs_a_command_without_a_transport_by_hand(state_dir: Path, tmp_path: Path) -> None:
    import os

    import slotq

    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        result = slotq.run(["sh", "-c", "echo hi; exit 4"], budget="1m", label="api", cwd=str(tmp_path),
                           output=(fd, fd))
    finally:
        os.close(fd)
    record = valid(result.to_dict())
    assert (record["outcome"], record["exit_code"], record["budget"], record["label"]) == ("failed", 4, 60.0, "api")
    assert out.read_text() == "hi\n"
    with pytest.raises(slotq.UsageError, match="unknown class"):
        slotq.run(["true"], cls="nope")
    assert "`host`" in (slotq.run.__doc__ or "") and "budget" in (slotq.run.__doc__ or "")
