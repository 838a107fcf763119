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
    command="positional",
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
    waiting = _waiting()
    if opts.label or opts.mine:
        targets += [r for r in _matching(opts.label, waiting) if r not in targets]
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
        live = waiting.get(run_id) or _holding(run_id)
        try:
            reply = _send(run_id, live)
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
        elif reply.text == "impostor" and live is not None:
            # The run is its user's (their ticket, or a slot they hold), and
            # only another user's socket listens under its id: a name taken.
            _say(f"slotq cancel: error: run {run_id}'s control socket is held by pid {reply.runner_pid} "
                 f"(user {user_name(reply.runner_uid)}), not by the run's runner (user "
                 f"{user_name(live.uid)}): nothing sent (someone took the run's name)")
            code = code or 1
        elif reply.text == "impostor":
            # No run of ours by that id; another user's socket listens under
            # it: their run, or a name they took. Nothing was sent to it.
            _say(f"slotq cancel: error: run {run_id} belongs to user {user_name(reply.runner_uid)} (its control "
                 f"socket is held by their pid {reply.runner_pid}): you can cancel only your own runs")
            code = EXIT_REFUSED
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


class _NotListening(OSError):
    def __init__(self, pid: object) -> None:
        super().__init__(f"run's runner (pid {pid}) does not listen")
        self.pid = pid


class _Waiting(NamedTuple):
    """A run of ours waiting in line, as its ticket says: a file of ours
    (the kernel's owner), so its words are our own."""
    uid: int
    pid: object
    label: object


def _send(run_id: str, waiting: _Waiting | None) -> CancelReply:
    """Send the cancel, only ever to a socket of the run's user: ours (or,
    for root, the user whose ticket names the run). A run in line whose
    runner does not listen yet -- it opens its control socket when it must
    wait, or once its command has run 0.1 s -- is tried again, for up to
    LISTEN_WAIT while its runner lives: a script that cancels the run it
    just started must not hear "no live run". A run waiting away (a shell:
    host/away.py) is woken first (SIGUSR1): it comes back, and listens."""
    from slotq.host.control import send_cancel
    from slotq.procinfo import alive

    me = os.getuid()
    expect = me if me != 0 else (waiting.uid if waiting is not None else None)
    deadline = time.monotonic() + LISTEN_WAIT
    woken = False
    reply: CancelReply | None = None
    while True:
        try:
            said = send_cancel(run_id, expect_uid=expect)
            if said.text != "impostor" or waiting is None or waiting.uid != expect:
                return said
            # Ours in line, and only another user's socket under its id: ours
            # is not open yet (a name taken first never stops our own).
            reply = said
        except (ConnectionRefusedError, FileNotFoundError):
            if waiting is None:
                raise
        if not alive(waiting.pid, None):
            if reply is not None:
                return reply
            raise ConnectionRefusedError(f"no socket listens for run {run_id}")
        if not woken:
            woken = True
            from slotq.host.away import SIGUSR1, away_pid

            if away_pid(waiting.pid):  # waiting away (host/away.py): it comes back, and listens
                os.kill(waiting.pid, SIGUSR1)  # type: ignore[arg-type]
                deadline = time.monotonic() + LISTEN_WAIT
        if time.monotonic() >= deadline:
            if reply is not None:
                return reply
            raise _NotListening(waiting.pid)
        time.sleep(0.02)


def _waiting() -> dict[str, _Waiting]:
    """run id -> our runs waiting in this host's lines, from our own ticket
    files (root: everyone's, each from its owner's file) -- never from a
    holder record anyone in the group could have written."""
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.host.line import pool_dir, read_info, scan
    from slotq.host.proclocks import held_by_owner, owners

    state_dir = state_dir_from_env()
    me = os.getuid()
    out: dict[str, _Waiting] = {}
    table = owners()
    try:
        pools = list(HostConfig.load(state_dir=state_dir).pools)
    except Exception:  # no queue to look at: the runners' own answers decide
        return out
    for pool in pools:
        for e in scan(pool_dir(state_dir, pool)):
            if me not in (0, e.uid) or (table is not None and not held_by_owner(table, (e.dev, e.ino), e.uid)):
                continue
            info = read_info(e.path)
            run_id = info.get("run_id") if info else None
            if info and isinstance(run_id, str) and run_id not in out:
                out[run_id] = _Waiting(e.uid, info.get("pid"), info.get("label"))
    return out


def _holding(run_id: str) -> _Waiting | None:
    """A run of ours that holds a slot here, by the slot's record -- a
    file anyone in the group may write, so it is only ever a reason to
    give the run's runner a moment to open its socket (a run that has just
    started), never what is cancelled: its runner must be a process of
    ours, and the lock's holder too."""
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.host.status import holders
    from slotq.procinfo import uid_of

    state_dir = state_dir_from_env()
    try:
        config = HostConfig.load(state_dir=state_dir)
        for pool, count in config.pools.items():
            for entry in holders(state_dir, pool, count, time.time()):
                pid = entry.get("pid")
                if entry.get("run_id") == run_id and entry.get("uid") == os.getuid() \
                        and isinstance(pid, int) and uid_of(pid) == os.getuid():
                    return _Waiting(os.getuid(), pid, entry.get("label"))
    except Exception:  # no queue to look at: the runner's own answer decides
        return None
    return None


def _matching(label: str | None, waiting: dict[str, _Waiting]) -> list[str]:
    """Run ids of our live runs here whose label matches `label` (all of
    them if None): those waiting in line, by our own tickets, and those
    whose runner listens, by what each runner says (host/control.own_runs).
    Nothing a shared file says decides what is cancelled."""
    from fnmatch import fnmatchcase

    from slotq.host.control import own_runs
    from slotq.records import valid_text

    if label is not None:
        label = valid_text(label)  # as labels are kept: a byte that is not UTF-8 is `\xNN`
    found: dict[str, object] = {run_id: w.label for run_id, w in waiting.items()}
    for run_id, said in own_runs().items():
        found.setdefault(run_id, said)
    return [run_id for run_id, lab in found.items()
            if label is None or fnmatchcase(lab if isinstance(lab, str) else "", label)]


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
    """RUN_IDs and options, in any order (`cancel ID --host H`, as the MCP
    server's cancel_run says it, and `cancel --host H ID`)."""
    return PARSER.parse(args)


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

    me = os.getuid()
    # Our own jobs only (root: anyone's): another user's job under our run's
    # name is theirs, and never hides ours.
    every = slotq_jobs()
    jobs = {run_id: [j for j in js if j[1] == me or me == 0] for run_id, js in every.items()}
    targets: dict[str, list[str]] = {}
    code = 0
    if label is not None:
        pattern = as_comment(label)
        ids = ids + [run_id for run_id, js in jobs.items() if run_id not in ids
                     and any(comment is not None and fnmatchcase(comment, pattern) for _, _, comment in js)]
        if not ids:
            _say(f"slotq cancel: nothing to cancel: no live run matches --label {label!r} on the Slurm cluster")
            return 0
    for run_id in ids:
        if jobs.get(run_id):
            targets[run_id] = [job for job, _, _ in jobs[run_id]]
            continue
        theirs = every.get(run_id)
        if theirs:
            job, uid, _ = theirs[0]
            _say(f"slotq cancel: error: run {run_id} (Slurm job {job}) belongs to user {user_name(uid)}: "
                 f"you can cancel only your own runs")
            code = EXIT_REFUSED
            continue
        ended = ended_run(run_id)
        if ended is not None:
            _say(f"slotq cancel: run {run_id} has already ended ({ended}): nothing to cancel")
            continue
        _say(f"slotq cancel: error: no run {run_id} on the Slurm cluster (not live, and not in the history)")
        code = code or EXIT_NOT_FOUND
    if mine and label is None:
        targets.update({run_id: [job for job, uid, _ in js if uid == me] for run_id, js in jobs.items()
                        if any(uid == me for _, uid, _ in js)})
        if not targets:
            _say("slotq cancel: nothing to cancel: no live run matches --mine on the Slurm cluster")
            return 0
    if targets:
        cancel_jobs(sorted({job for js in targets.values() for job in js}))
    for run_id, js in targets.items():
        _say(f"slotq cancel: cancelled run {run_id} (Slurm job {', '.join(js)})")
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
