"""`slotq cancel`: end queued or running runs from another shell, like scancel."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, NamedTuple

from slotq.cli.args import FLAG, Namespace, Opt, Parser, host_options, use_slurm
from slotq.errors import UsageError
from slotq.host.kept import late_bound_hosts

if TYPE_CHECKING:
    from slotq.host.control import CancelReply

EXIT_REFUSED = 77  # EX_NOPERM: another user's run
EXIT_NOT_FOUND = 66  # EX_NOINPUT: no such run (live) on this host
LISTEN_WAIT = 2.0  # how long a live run's runner is given to open its control socket

PARSER = Parser(
    prog="slotq cancel", usage="slotq cancel [RUN_ID...] [--label PATTERN] [--mine] [--host HOST | --slurm]",
    command="optional",
    description="Cancel queued or running runs of yours: a queued run leaves the line, a running command is "
                "stopped (TERM, grace, KILL). Its caller ends `cancelled` (exit 130) with a message naming "
                "who cancelled it. Run ids are shown by `slotq status`. Another user's run is refused.",
    epilog="exit codes: 0 all cancelled, 1 a run could not be reached (or its socket is another user's), "
           "64 bad arguments, 66 no such live run, 77 refused (another user's run)\n",
    options=[
        Opt("--label", metavar="PATTERN", help="cancel the runs whose label matches PATTERN (shell-style: * ?)"),
        Opt("--mine", kind=FLAG, help="cancel all of your runs on this host"),
        *host_options("cancel runs on HOST", "several: on each of them"),
        Opt("--slurm", kind=FLAG,
            help="cancel your runs on the Slurm cluster: their jobs (named slotq-RUN_ID), pending or running, "
                 "through scancel; RUN_ID..., --label PATTERN (the job's comment) or --mine (default: "
                 "$SLOTQ_BACKEND=slurm)"),
    ],
)


def main(args: list[str]) -> int:
    opts, ids = _ids_and_options(args)
    if not ids and not opts.label and not opts.mine:
        raise PARSER.error("name the runs to cancel: RUN_ID..., --label PATTERN or --mine")
    from slotq.spec import is_run_id

    for run_id in ids:
        if not is_run_id(run_id):
            raise UsageError(f"{run_id!r} is not a run id (see `slotq status`)")
    slurm = use_slurm(opts)
    if opts.host and "," in opts.host and ids and all(_kept_here(i) for i in ids):
        opts.host = None  # late-bound over those hosts, and kept here: its process holds the places
    if opts.host:
        return _remote(opts, args)
    if slurm:
        return _slurm(ids, opts.label, opts.mine)
    targets = list(ids)
    owners = _owners()
    if opts.label or opts.mine:
        targets += [r for r in _matching(opts.label, opts.mine) if r not in targets]
        if not targets:  # nothing to do is not a failure (a cleanup under `set -e`; scancel alike)
            _say(f"slotq cancel: nothing to cancel: no live run matches"
                 f"{' --label ' + opts.label if opts.label else ''}{' --mine' if opts.mine else ''}")
            return 0
    from slotq.procinfo import user_name

    code = 0
    for run_id in targets:
        reach = late_bound_hosts(run_id)
        if reach is not None:  # kept here, late-bound over several hosts (`run --host A,B --detach`)
            code = _on_its_hosts(run_id, reach) or code
            continue
        try:
            reply = _send(run_id, owners.get(run_id))
        except _NotListening as e:
            _say(f"slotq cancel: error: cannot reach run {run_id}: its runner (pid {e.pid}) is in the queue "
                 f"but has not opened its control socket in {LISTEN_WAIT:g}s")
            code = code or 1
            continue
        except (ConnectionRefusedError, FileNotFoundError):
            from slotq.host.kept import in_slurm

            if in_slurm(run_id):  # kept here, run as a Slurm job (`run --slurm --detach`)
                code = _slurm([run_id], None, False) or code
                continue
            ended = ended_run(run_id)
            if ended is not None:  # nothing to do, as scancel of a finished job
                _say(f"slotq cancel: run {run_id} has already ended ({ended}): nothing to cancel")
                continue
            _say(f"slotq cancel: error: no run {run_id} on this host (not live, and not in its history)")
            code = code or EXIT_NOT_FOUND
            continue
        except OSError as e:
            _say(f"slotq cancel: error: cannot reach run {run_id}: {e.strerror or e}")
            code = code or 1
            continue
        if reply.ok:
            _say(f"slotq cancel: cancelled run {run_id}")
        elif reply.text == "impostor":
            _say(f"slotq cancel: error: run {run_id}'s control socket is held by pid {reply.runner_pid} "
                 f"(user {user_name(reply.runner_uid)}), not by the run's runner (user "
                 f"{user_name(owners[run_id].uid)}): nothing sent (someone took the run's name)")
            code = code or 1
        elif reply.text.startswith("refused"):
            _say(f"slotq cancel: error: run {run_id} belongs to user {user_name(reply.runner_uid)}: "
                 f"you can cancel only your own runs")
            code = EXIT_REFUSED
        else:
            _say(f"slotq cancel: error: run {run_id}: unexpected answer {reply.text[:80]!r}")
            code = code or 1
    return code


def ended_run(run_id: str) -> str | None:
    """How our run `run_id` ended, from this host's history (its last
    RECENT_RUNS runs, read, never written: not even the index cache);
    None if no line of ours says (history.own: another member's line
    naming the id is not our run's, and never stops us using it)."""
    from slotq import history
    from slotq.config import state_dir_from_env

    found = [r for r in history.recent(state_dir_from_env(), RECENT_RUNS)
             if r.get("run_id") == run_id and (history.own(r) or os.getuid() == 0)]
    return None if not found else str(found[-1].get("outcome") or "unknown")


RECENT_RUNS = 5000  # runs of the history a cancel of an ended run, or a new --run-id, looks through


class _Live(NamedTuple):
    """A live run as the queue shows it: its user (the kernel's word) and
    its runner process."""
    uid: int
    pid: object
    pid_start: object


class _NotListening(OSError):
    def __init__(self, pid: object) -> None:
        super().__init__(f"run's runner (pid {pid}) does not listen")
        self.pid = pid


def _send(run_id: str, live: _Live | None) -> CancelReply:
    """Send the cancel. A run the queue shows live whose runner does not
    listen yet -- it opens its control socket when it must wait, or once
    its command has run 0.1 s -- is tried again, for up to LISTEN_WAIT while
    its runner lives: a script that cancels the run it just started must
    not hear "no live run". A run waiting away (a shell: host/away.py) is
    woken first (SIGUSR1): it comes back, and listens."""
    from slotq.host.control import send_cancel
    from slotq.procinfo import alive

    deadline = time.monotonic() + LISTEN_WAIT
    woken = False
    while True:
        try:
            return send_cancel(run_id, expect_uid=live.uid if live else None)
        except (ConnectionRefusedError, FileNotFoundError):
            if live is None or not alive(live.pid, live.pid_start):
                raise
            if not woken:
                woken = True
                from slotq.host.away import SIGUSR1, away_pid

                if away_pid(live.pid):  # waiting away (host/away.py): it comes back, and listens
                    os.kill(live.pid, SIGUSR1)  # type: ignore[arg-type]
                    deadline = time.monotonic() + LISTEN_WAIT
            if time.monotonic() >= deadline:
                raise _NotListening(live.pid) from None
            time.sleep(0.02)


def _owners() -> dict[str, _Live]:
    """run id -> the live run in this host's queue: its uid from the kernel
    (its ticket file's owner, or its slot lock's holder) -- never from a
    record anyone could have written -- and its runner's pid."""
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.host.status import snapshot

    state_dir = state_dir_from_env()
    out: dict[str, _Live] = {}
    try:
        snap = snapshot(state_dir, HostConfig.load(state_dir=state_dir), 0.0, 0)
    except Exception:  # no queue to look at: the runner's own answer decides
        return out
    for pool in snap["pools"]:  # type: ignore[attr-defined]
        for entry in [*pool["slots"], *pool["waiting"]]:
            run_id, uid = entry.get("run_id"), entry.get("uid")
            if isinstance(run_id, str) and isinstance(uid, int) and run_id not in out:
                out[run_id] = _Live(uid, entry.get("pid"), entry.get("pid_start"))
    return out


def _matching(label: str | None, mine: bool) -> list[str]:
    """Run ids of the live runs in this host's queue (waiting or holding a
    slot) whose label matches `label`; with `mine`, only ours (by the kernel's
    word: the owner of the runner process)."""
    from fnmatch import fnmatchcase

    from slotq.config import HostConfig, state_dir_from_env
    from slotq.procinfo import alive, uid_of
    from slotq.records import valid_text
    from slotq.host.status import snapshot

    if label is not None:
        label = valid_text(label)  # as labels are kept: a byte that is not UTF-8 is `\xNN`
    state_dir = state_dir_from_env()
    snap = snapshot(state_dir, HostConfig.load(state_dir=state_dir), 0.0, 0)
    out: list[str] = []
    for pool in snap["pools"]:  # type: ignore[attr-defined]
        for entry in [*pool["slots"], *pool["waiting"]]:
            run_id, pid = entry.get("run_id"), entry.get("pid")
            if not isinstance(run_id, str) or not isinstance(pid, int):
                continue
            if entry.get("phase") in ("stopping", "orphaned") or not alive(pid, entry.get("pid_start")):
                continue
            if label is not None and not fnmatchcase(str(entry.get("label") or ""), label):
                continue
            if mine and uid_of(pid) != os.getuid():
                continue
            out.append(run_id)
    return out


def _remote(opts: Namespace, args: list[str]) -> int:
    """The same on each host named: `slotq cancel` run there over ssh."""
    local = _strip_host_options(args)
    code = 0
    for host in [h for h in opts.host.split(",") if h]:
        rc, out, err = _on_host(host, opts.ssh_config, opts.ssh_option, opts.remote_slotq, local)
        sys.stdout.buffer.write(out)
        for line in err.splitlines():
            _say(line)
        code = code or rc
    return code


def _ids_and_options(args: list[str]) -> tuple[Namespace, list[str]]:
    """RUN_ID... first or last, options around them (`cancel ID --host H`,
    as the MCP server's cancel_run says it)."""
    lead = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    opts, rest = PARSER.parse(args[lead:])
    return opts, args[:lead] + rest


def _kept_here(run_id: str) -> bool:
    return late_bound_hosts(run_id) is not None


def _on_host(host: str, config: str | None, options: list[str] | None, remote_slotq: str,
             args: list[str]) -> tuple[int, bytes, str]:
    """`slotq cancel ARGS` on `host` over ssh: (exit code, stdout, its
    stderr's lines naming the host); a host that cannot be reached says
    so (exit 121, unavailable)."""
    import shlex

    from slotq.errors import HostUnavailable
    from slotq.transports.ssh import SshHost

    remote = SshHost(host, config=config, options=options, remote_slotq=remote_slotq)
    try:
        remote.ensure_master()
        rc, out, err = remote.call(f"cancel {shlex.join(args)}", 60, f"host {host} did not answer within 60s")
    except HostUnavailable as e:  # the other hosts' runs are still cancelled
        return HostUnavailable.exit_code, b"", f"slotq cancel: error: {e}"
    if rc == 255:
        return HostUnavailable.exit_code, out, f"slotq cancel: error: cannot reach host {host}"
    said = err.decode(errors="replace").splitlines()
    return rc, out, "\n".join(line.replace("slotq cancel:", f"slotq cancel ({host}):", 1) for line in said)


def _on_its_hosts(run_id: str, reach: dict[str, object]) -> int:
    """A run kept here, late-bound over several hosts: cancelled where it
    is -- in each host's line while it waits, on the host whose slot it
    took since (the others then have nothing of it: not said)."""
    from slotq.transports.kept import Reach

    try:
        r = Reach.from_dict(reach)
    except ValueError as e:
        _say(f"slotq cancel: error: run {run_id}: its hosts cannot be read back ({e})")
        return 1
    answers = {h: _on_host(h, r.ssh_config, r.ssh_options, r.remote_slotq, [run_id]) for h in r.hosts}
    done = [h for h, (rc, _, err) in answers.items() if rc == 0 and f"cancelled run {run_id}" in err]
    if done:
        _say(f"slotq cancel: cancelled run {run_id} (late-bound: on {', '.join(done)})")
        return 0
    for rc, _, err in answers.values():
        for line in err.splitlines():
            _say(line)
    return next((rc for rc, _, _ in answers.values() if rc), 0)


def _slurm(ids: list[str], label: str | None, mine: bool) -> int:
    """The runs' Slurm jobs, scancelled (pending: they leave Slurm's line;
    running: Slurm signals them, and the node's runner ends the command).
    Each caller ends `cancelled`, naming who cancelled it. A label is
    matched against the job's comment, where `run --slurm` puts it."""
    from fnmatch import fnmatchcase

    from slotq.procinfo import user_name
    from slotq.transports.slurm.ctl import as_comment, cancel_jobs, slotq_jobs

    jobs = slotq_jobs()
    me = os.getuid()
    targets: dict[str, str] = {}
    code = 0
    if label is not None:
        pattern = as_comment(label)
        ids = ids + [run_id for run_id, (_, uid, comment) in jobs.items()
                     if comment is not None and fnmatchcase(comment, pattern) and run_id not in ids
                     and (not mine or uid == me)]
        if not ids:
            _say(f"slotq cancel: nothing to cancel: no live run matches --label {label!r} on the Slurm cluster")
            return 0
    for run_id in ids:
        job, uid, _ = jobs.get(run_id, ("", -1, None))
        if not job:
            ended = ended_run(run_id)
            if ended is not None:
                _say(f"slotq cancel: run {run_id} has already ended ({ended}): nothing to cancel")
                continue
            _say(f"slotq cancel: error: no run {run_id} on the Slurm cluster (not live, and not in the history)")
            code = code or EXIT_NOT_FOUND
        elif uid != me and me != 0:  # root may, as scancel lets it
            _say(f"slotq cancel: error: run {run_id} (Slurm job {job}) belongs to user {user_name(uid)}: "
                 f"you can cancel only your own runs")
            code = EXIT_REFUSED
        else:
            targets[run_id] = job
    if mine and label is None:
        targets.update({run_id: job for run_id, (job, uid, _) in jobs.items() if uid == me})
        if not targets:
            _say("slotq cancel: nothing to cancel: no live run matches --mine on the Slurm cluster")
            return 0
    if targets:
        cancel_jobs(sorted(set(targets.values())))
    for run_id, job in targets.items():
        _say(f"slotq cancel: cancelled run {run_id} (Slurm job {job})")
    return code


def _strip_host_options(args: list[str]) -> list[str]:
    takes_value = {"--host", "--ssh-config", "--ssh-option", "--remote-slotq"}
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in takes_value:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
