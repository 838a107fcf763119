"""The client's relay of a Slurm run (transports/slurm/: `Relay`, and `JobEnding`
that decides how a job ended), pure
logic: what srun and the node's runner said, and Slurm's facts about the
job, are given to it as they are said (a fake `job_info`, no srun), for the
endings a one-node test cluster cannot cause on demand or only by a race.
The same paths end to end, against the real cluster: test_slurm_e2e.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# An ending the relay decides is written to the history of $SLOTQ_STATE_DIR:
# the test's own, never the user's.
pytestmark = pytest.mark.usefixtures("state_dir")


@pytest.mark.parametrize("node, outcome", [
    ({"outcome": "failed", "exit_code": None, "signal": 15, "message": "command killed by signal 15"}, "cancelled"),
    ({"outcome": "unavailable", "exit_code": None, "signal": None,
      "message": "the command's supervisor (slotq keeper, pid 7) was killed after the command started"}, "cancelled"),
    # A shell running the command turns its child's SIGTERM or SIGKILL into
    # its own exit 128+n ("Terminated", exit 143): the same cancel.
    ({"outcome": "failed", "exit_code": 143, "signal": None, "message": "command exited 143"}, "cancelled"),
    ({"outcome": "failed", "exit_code": 137, "signal": None, "message": "command exited 137"}, "cancelled"),
    ({"outcome": "passed", "exit_code": 0, "signal": None, "message": "exit 0"}, "passed"),
    ({"outcome": "failed", "exit_code": 1, "signal": None, "message": "exit 1"}, "failed"),
    ({"outcome": "failed", "exit_code": 130, "signal": None, "message": "command exited 130"}, "failed"),
])
def test_a_ctrl_c_that_beats_the_nodes_hello_is_reported_as_cancelled(node: dict[str, object], outcome: str) -> None:
    # Pure logic: the relay saw the client's cancel before srun relayed the
    # node's hello (a few ms after the command started: seen in 4 of 36
    # real Ctrl-Cs, as `failed (exit 143)` and `unavailable`), so it
    # scancelled the job, and Slurm's SIGTERM reached the command and its
    # keeper. That is the cancel, not a failure; a result the node had
    # already reached on its own stands.
    from slotq import protocol
    from slotq.config import HostConfig
    from slotq.spec import RunSpec
    from slotq.transports import slurm
    from slotq.transports.slurm.relay import Relay

    t = slurm.SlurmTransport(HostConfig())
    t.job_id = "42"
    r, w = os.pipe()
    relay = Relay(t, RunSpec(["true"]), -1, w)
    relay.end.cancel_reason = "cancelled"
    relay.forward([(protocol.EVENT, {"event": "hello", "at": 1.0, "protocol": protocol.PROTOCOL_VERSION,
                                     "host": "node", "pid": 1, "run_id": "x"}),
                   (protocol.EVENT, {"event": "exited", "at": 2.0, "phases": {}, **node})])
    os.close(w)
    with os.fdopen(r, "rb") as f:
        frames = protocol.Decoder().feed(f.read())
    ev = frames[-1][1]
    assert isinstance(ev, dict) and ev["event"] == "exited" and ev["outcome"] == outcome, ev
    if outcome == "cancelled":
        assert "slotq cancelled Slurm job 42" in str(ev["message"]) and str(node["message"]) in str(ev["message"])


@pytest.mark.parametrize("node, info, outcome", [
    ({"outcome": "failed", "exit_code": 143, "signal": None, "message": "command exited 143"},
     {"JobState": "CANCELLED", "AcctState": "CANCELLED by 0"}, "cancelled"),
    ({"outcome": "failed", "exit_code": None, "signal": 9, "message": "command killed by signal 9"},
     {"JobState": "CANCELLED"}, "cancelled"),
    # Killed, but not by a cancel of the job (the command's own kill, the
    # OOM killer): the work's, as the node said.
    ({"outcome": "failed", "exit_code": None, "signal": 9, "message": "command killed by signal 9"},
     {"JobState": "COMPLETED"}, "failed"),
    ({"outcome": "failed", "exit_code": 1, "signal": None, "message": "command exited 1"},
     {"JobState": "CANCELLED"}, "failed"),
])
def test_a_scancel_of_a_running_job_is_cancelled_even_if_the_command_died_first(
        monkeypatch: pytest.MonkeyPatch, node: dict[str, object], info: dict[str, str], outcome: str) -> None:
    # Pure logic (a fake job_info and no srun): a scancel signals the
    # command and the node's runner at once; when the command died first,
    # the runner said `failed (exit 143)` -- seen in a full suite, with
    # `slotq cancel --slurm` -- and the caller ended 143, the work blamed.
    from slotq import protocol
    from slotq.config import HostConfig
    from slotq.spec import RunSpec
    from slotq.transports import slurm
    from slotq.transports.slurm import ending
    from slotq.transports.slurm.relay import Relay

    monkeypatch.setattr(ending, "job_info", lambda job, env=None: dict(info))
    t = slurm.SlurmTransport(HostConfig())
    t.job_id = "42"
    r, w = os.pipe()
    relay = Relay(t, RunSpec(["true"]), -1, w)
    relay.forward([(protocol.EVENT, {"event": "hello", "at": 1.0, "protocol": protocol.PROTOCOL_VERSION,
                                     "host": "node", "pid": 1, "run_id": "x"}),
                   (protocol.STDOUT, b"out"),
                   (protocol.EVENT, {"event": "exited", "at": 2.0, "phases": {}, **node})])
    assert relay.ended
    if relay.held is not None:
        relay.release()  # as run() does once srun has ended
    os.close(w)
    with os.fdopen(r, "rb") as f:
        frames = protocol.Decoder().feed(f.read())
    assert frames[1] == (protocol.STDOUT, b"out")
    ev = frames[-1][1]
    assert isinstance(ev, dict) and ev["event"] == "exited" and ev["outcome"] == outcome, ev
    if outcome == "cancelled":
        assert str(ev["message"]).startswith("Slurm job 42 (JobState=CANCELLED") and \
            "while it ran" in str(ev["message"]) and str(node["message"]) in str(ev["message"]), ev


@pytest.mark.parametrize("info, outcome, needles", [
    ({"JobState": "NODE_FAIL", "Reason": "NodeDown", "NodeList": "n7"}, "unavailable",
     ["JobState=NODE_FAIL", "Reason=NodeDown", "NodeList=n7"]),
    ({"JobState": "PREEMPTED", "Reason": "None"}, "unavailable", ["JobState=PREEMPTED"]),
    ({"JobState": "BOOT_FAIL"}, "unavailable", ["JobState=BOOT_FAIL"]),
    ({}, "unavailable", ["Slurm no longer knows it"]),
    ({"JobState": "TIMEOUT", "TimeLimit": "00:03:00"}, "backstop", ["Slurm's time limit (00:03:00)"]),
    ({"JobState": "CANCELLED", "AcctState": "CANCELLED by 0"}, "cancelled", ["cancelled by root (scancel)"]),
])
def test_how_slurm_ended_a_job_maps_to_an_outcome_in_the_result_and_the_history(
        monkeypatch: pytest.MonkeyPatch, state_dir: Path, info: dict[str, str], outcome: str,
        needles: list[str]) -> None:
    # Pure logic (a fake job_info): NODE_FAIL and its kin cannot be caused
    # on demand in a one-node test cluster.
    from slotq import protocol
    from slotq.config import HostConfig
    from slotq.spec import RunSpec
    from slotq.transports import slurm
    from slotq.transports.slurm import ending
    from slotq.transports.slurm.relay import Relay

    monkeypatch.setattr(ending, "job_info", lambda job, env=None: dict(info))
    t = slurm.SlurmTransport(HostConfig())
    t.job_id = "42"
    r, w = os.pipe()
    spec = RunSpec(["true"], label="the run", submitted=1.8e9)
    relay = Relay(t, spec, -1, w)
    relay.end.allocated_at = 1.8e9 + 5
    relay.conclude(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        frames = protocol.Decoder().feed(f.read())
    ev = frames[-1][1]
    assert isinstance(ev, dict) and ev["event"] == "exited" and ev["outcome"] == outcome, ev
    assert "Slurm job 42" in str(ev["message"]) and all(n in str(ev["message"]) for n in needles), ev
    # No runner on a node wrote this ending: the relay does, with the wait in Slurm's line.
    from slotq import history

    [line] = history.recent(str(state_dir))
    assert (line["run_id"], line["label"], line["outcome"], line["message"]) == (
        spec.run_id, "the run", outcome, ev["message"]), line
    assert (line["slot"], line["waited_s"]) == ("slurm job 42", 5.0), line


@pytest.mark.parametrize("reason, never", [
    ("PartitionTimeLimit", "shorter --budget"), ("QOSMaxWallDurationPerJobLimit", "shorter --budget"),
    ("AssocMaxWallDurationPerJobLimit", "shorter --budget"), ("QOSMaxCpuPerJobLimit", "more than one job may"),
    ("AssocMaxNodePerJobLimit", "more than one job may"), ("BadConstraints", "cannot be met"),
    ("InvalidQOS", "cannot be met"),
    # A busy cluster, or limits on a user's jobs together: they pass.
    ("Resources", None), ("Priority", None), ("PartitionDown", None), ("PartitionConfig", None),
    ("QOSMaxJobsPerUserLimit", None), ("AssocGrpCpuLimit", None), ("QOSGrpNodeLimit", None),
])
def test_only_reasons_that_never_pass_end_a_pending_job(reason: str, never: str | None) -> None:
    from slotq.transports.slurm.relay import never_starts

    change = never_starts(reason)
    assert (change is None) if never is None else (change is not None and never in change), change


@pytest.mark.parametrize("lines, kind, needle", [
    # srun on a machine with no Slurm configuration: it was exit 2, "Slurm refused the job"
    (["srun: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host",
      "srun: error: fetch_config: DNS SRV lookup failed",
      "srun: error: _establish_config_source: failed to fetch config"], "unavailable", "Slurm is not set up here"),
    (["srun: error: Unable to contact slurm controller (connect failure)"], "unavailable", "Slurm is not answering"),
    (["srun: error: Unable to allocate resources: Invalid partition name specified"], "usage",
     "Slurm refused the job"),
])
def test_a_job_slurm_never_had_is_told_apart_by_why(lines: list[str], kind: str, needle: str) -> None:
    # Pure logic (srun's last words, as it says them): a machine without a
    # Slurm configuration makes srun look the controller up in DNS, which
    # the tests may not do.
    from slotq import protocol
    from slotq.config import HostConfig
    from slotq.spec import RunSpec
    from slotq.transports import slurm
    from slotq.transports.slurm.relay import Relay

    t = slurm.SlurmTransport(HostConfig())
    t._lines.extend(lines)
    r, w = os.pipe()
    Relay(t, RunSpec(["true"]), -1, w).conclude(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        frames = protocol.Decoder().feed(f.read())
    ev = frames[-1][1]
    assert isinstance(ev, dict) and ev["event"] == "error" and ev["kind"] == kind, ev
    assert needle in str(ev["message"]) and lines[-1].split("error: ", 1)[1] in str(ev["message"]), ev


def test_a_slurm_tool_that_does_not_answer_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pure logic (a fake _run): it was Python's own words, "squeue failed:
    # Command '[...]' timed out after 30 seconds". Seen with no Slurm
    # configuration (srun/squeue then look the controller up in DNS).
    import subprocess

    from slotq.errors import HostUnavailable
    from slotq.transports.slurm import ctl as slurmctl

    def hang(argv: list[str], env: object, timeout: float) -> object:
        raise subprocess.TimeoutExpired(argv, timeout)

    monkeypatch.setattr(slurmctl, "_run", hang)
    with pytest.raises(HostUnavailable) as e:
        slurmctl.slotq_jobs()
    assert str(e.value) == ("squeue did not answer within 30 s (slurmctld down, or no Slurm configuration "
                            "here?)")
