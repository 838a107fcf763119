"""One run, one record, defined once (issue 66, item 6): src/slotq/record.py's
FIELDS is the run record; the JSON Schema, the MCP tools' output schema,
the caller's result, a host's history line and the history index are made
from it or checked against it here; every path that writes a history line
gives every field; and the record of the same run, read every way -- live,
attached before and after its result was taken, the history, the Python
API, the MCP server -- is the same, field by field."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import Start, history_written, holder_record, live_tickets, slotq_cmd, start_holder, wait_for
from slotq import record

ROOT = Path(__file__).resolve().parent.parent

# What only the caller knows (how it reached the host), null in a history.
CALLERS = ("transfer_s", "transport")


def slotq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + list(args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- made from FIELDS, or checked against it

@pytest.mark.timeout(30)
def test_the_json_schema_in_docs_is_the_one_record_py_makes() -> None:
    written = json.loads((ROOT / "docs/schema/run-record.json").read_text())
    assert written == record.schema(), "run `python -m slotq.record > docs/schema/run-record.json`"
    assert written["required"] == list(record.NAMES)


@pytest.mark.timeout(30)
def test_every_field_has_a_type_a_meaning_and_a_phase() -> None:
    phases = set(record.PHASES) | {"reader"}
    json_types = {"string", "integer", "number", "object", "null", "boolean"}
    assert len({f.name for f in record.FIELDS}) == len(record.FIELDS)
    for f in record.FIELDS:
        assert f.types and set(f.types) <= json_types, f.name
        assert len(f.meaning) > 10 and f.set_at in phases, f.name
        assert (f.line is None) == (f.set_at == "reader" or f.name in CALLERS), f.name


@pytest.mark.timeout(30)
def test_the_callers_result_has_every_field_in_order() -> None:
    from slotq.client.result import RunResult
    from slotq.spec import RunSpec

    assert tuple(RunResult(RunSpec(["true"]), "here").to_dict()) == record.NAMES


@pytest.mark.timeout(30)
def test_a_history_line_has_every_field_a_host_writes_and_every_writer_must_give_them() -> None:
    from slotq import history

    params = inspect.signature(history.run_record).parameters
    given = {"cls" if f.line == "class" else f.line for f in record.FIELDS
             if f.line not in (None, "exit_code", "waited_s", "ran_s")} | {"exit_code"}
    assert given <= set(params)
    for name in given:  # none left out by a path that writes a line (the keeper's, a buried ticket, Slurm's)
        assert params[name].default is inspect.Parameter.empty, name
    args: dict[str, Any] = {**{name: None for name in given}, "outcome": "passed", "phases": {}}
    line = history.run_record(**args)
    assert set(line) == set(record.LINE_KEYS) | {"uid"}


@pytest.mark.timeout(30)
def test_the_history_index_has_a_column_for_every_field_of_a_history() -> None:
    from slotq.history.index import COLUMNS

    for f in record.FIELDS:
        if f.name in CALLERS or f.name in ("schema_version", "exit_code"):
            continue  # the caller's; the version; slotq's exit code, made from the outcome as it is read
        if f.name == "phases":
            assert {"submitted", "slot_at", "prepared", "started", "ended"} <= set(COLUMNS)
        else:
            assert (f.line or f.name) in COLUMNS, f.name


@pytest.mark.timeout(30)
def test_the_mcp_tools_output_schema_is_the_records() -> None:
    from slotq.cli.mcptools import RECORD_SCHEMA

    props = RECORD_SCHEMA["properties"]
    assert isinstance(props, dict)
    for name, schema in record.properties().items():
        if name != "output":  # (the tools' own, with its parts)
            assert props[name] == schema, name
    required = RECORD_SCHEMA["required"]
    assert isinstance(required, list) and set(record.NAMES) <= set(required)


# ---------------------------------------------------------------- the same run, every way

def _same(records: dict[str, dict[str, Any]], skip: tuple[str, ...] = ()) -> None:
    """Every way's record equals the first's, field by field (the
    caller's own fields aside where the way cannot know them)."""
    (first_way, first), *rest = records.items()
    for way, rec in rest:
        for name in record.NAMES:
            if name in skip or (name in CALLERS and (way != "live" or first_way != "live")):
                continue
            assert rec.get(name) == first.get(name), f"{name}: {first_way} {first.get(name)!r}, {way} {rec.get(name)!r}"


def _in_order(rec: dict[str, Any]) -> None:
    times = [rec["phases"][p] for p in record.PHASES if rec["phases"].get(p) is not None]
    assert times == sorted(times), rec["phases"]


def _history(run_id: str) -> dict[str, Any]:
    listed = slotq("history", "--json")
    assert listed.returncode == 0, listed.stderr
    (rec,) = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id]
    return {k: v for k, v in rec.items() if k not in record.HISTORY_EXTRA}


def _attach(run_id: str, tmp_path: Path, name: str) -> dict[str, Any]:
    path = tmp_path / f"{name}.json"
    slotq("attach", run_id, "--json", str(path))
    return dict(json.loads(path.read_text()))


def _python(run_id: str) -> dict[str, Any]:
    from slotq.client.kept import KeptRun

    return KeptRun(run_id).attach(30, stdout_fd=-1, stderr_fd=-1).to_dict()


@pytest.mark.timeout(90)
def test_a_run_that_waited_reads_the_same_live_in_its_history_attached_and_from_python(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    r = runs("-q", "--label", "the one", "--budget", "5m", "--", "sh", "-c", "echo hi; exit 3", name="one")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the run in line")
    gate.touch()
    assert r.wait() == 3
    live = r.result()
    assert live["ticket"] is not None and live["budget"] == 300.0 and live["waited_s"] > 0, live
    _in_order(live)
    _same({"live": live, "history": _history(live["run_id"]), "attach": _attach(live["run_id"], tmp_path, "a"),
           "python": _python(live["run_id"])})


@pytest.mark.timeout(90)
def test_a_kept_run_reads_the_same_attached_before_and_after_its_result_was_taken(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    left = slotq("run", "--attach-for", "1s", "--json", str(tmp_path / "left.json"), "--label", "kept one",
                 "--", "sh", "-c", "echo hi; exit 3")
    assert left.returncode == 75, left.stderr
    detached = json.loads((tmp_path / "left.json").read_text())
    gate.touch()
    before = _attach(detached["run_id"], tmp_path, "before")  # the run's own result, from its log
    assert before["outcome"] == "failed" and before["command_exit_code"] == 3, before
    assert before["ticket"] == detached["ticket"] is not None and before["budget"] == detached["budget"], detached
    assert before["phases"]["submitted"] == detached["phases"]["submitted"]
    _in_order(before)
    _same({"attach before": before, "attach after": _attach(detached["run_id"], tmp_path, "after"),
           "history": _history(detached["run_id"]), "python": _python(detached["run_id"])})


@pytest.mark.timeout(90)
def test_the_mcp_servers_record_of_a_run_is_the_same_as_the_clis(state_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="the mcp extra (pip install -e '.[test]' installs it)")
    import anyio
    from test_mcp import server, structured

    got: dict[str, Any] = {}

    async def body() -> None:
        async with server(tmp_path) as s:
            ran = structured(await s.call_tool("run_command", {"command": ["sh", "-c", "exit 3"], "wait_for": 30}))
            got["run"] = ran
            got["result"] = structured(await s.call_tool("run_result", {"run_id": ran["run_id"]}))
    anyio.run(body)
    run_id = got["run"]["run_id"]
    assert got["run"]["outcome"] == "failed"
    _same({"mcp run_command": got["run"], "mcp run_result": got["result"], "history": _history(run_id),
           "attach": _attach(run_id, tmp_path, "a")})


# ---------------------------------------------------------------- every writer of a history line

@pytest.mark.timeout(60)
def test_a_run_gone_in_line_has_its_ticket_budget_and_no_slot_in_the_line_its_burier_writes(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    gone = runs("-q", "--budget", "7m", "--", "true", name="gone")
    wait_for(lambda: len(live_tickets(state_dir)) == 1, what="the run in line")
    ticket = int(Path(live_tickets(state_dir)[0]).name.split(".")[0])
    gone.kill()  # its runner (and so its keeper: PDEATHSIG) gone
    wait_for(lambda: not live_tickets(state_dir), what="its ticket dead")
    gate.touch()  # the holder, leaving, buries it
    wait_for(lambda: any(r.get("outcome") == "caller_gone" for r in history_written(state_dir)),
             what="the line of the run gone in line")
    (line,) = [r for r in history_written(state_dir) if r.get("outcome") == "caller_gone"]
    assert line["ticket"] == ticket and line["budget"] == 420.0 and line["slot"] is None, line
    assert line["kept"] is None and line["waited_s"] is not None


@pytest.mark.timeout(60)
def test_a_run_whose_runner_vanished_has_its_slot_ticket_and_budget_in_the_line_its_keeper_writes(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate, "--budget", "9m")
    ticket = holder_record(state_dir).get("ticket")
    holder.kill()  # its runner: its keeper ends the command and writes the line
    wait_for(lambda: history_written(state_dir), what="the keeper's line")
    (line,) = history_written(state_dir)
    assert line["outcome"] == "caller_gone" and "host runner vanished" in line["message"], line
    assert line["slot"] == "shared#0" and line["budget"] == 540.0 and line["ticket"] == ticket is not None, line
    assert line["phases"]["slot"] is not None and line["phases"]["started"] is not None, line
