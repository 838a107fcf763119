"""`slotq host keep` and `slotq host attach`: the host side of kept runs
(host/kept.py), as the client's transport starts them (transports/kept.py).

`host keep` reads the run's request on stdin, makes the run's directory,
starts the run's own process (a new session: it outlives this one and the
caller; client/standin.py) and then attaches to it, as `host attach` does:
the stream on stdout until the run ends, `--attach-for` passes, or (with
`--detach`) the run has its place. The run's process carries the run here,
or is the caller of its Slurm job (`--slurm`) or of its reservations on
several hosts (`--hosts`).
"""

from __future__ import annotations

import os
import time

from slotq.cli.args import FLAG, Opt, Parser, duration, positive_int, slurm_options
from slotq.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slotq.spec import RunSpec

def _reach(text: str) -> dict[str, object]:
    from slotq.transports.kept import Reach

    return Reach.parse(text).to_dict()


KEEP = Parser(
    prog="slotq host keep", usage="slotq host keep --request-stdin [options]",
    description="Start a kept run (it outlives this process and its caller) from the request on stdin, then "
                "attach to it: its stream on stdout. Used by transports, not by people.",
    options=[
        Opt("--request-stdin", kind=FLAG, required=True, help="read the request as one JSON line from stdin"),
        Opt("--lease", metavar="D", convert=duration(minimum=1.0),
            help="how long the run waits for an attacher to come back (1s to 30d)"),
        Opt("--log-max", metavar="BYTES", convert=positive_int, help="the bound of the run's output log"),
        Opt("--idle", metavar="D", convert=duration(), help="the no-output watchdog, from the command's start"),
        Opt("--credit-dir", metavar="DIR", help="record the run's wait in the wait ledger under DIR"),
        Opt("--attach-for", metavar="D", convert=duration(allow_zero=True), help="stay attached at most D"),
        Opt("--detach", kind=FLAG, help="stay attached only until the run has its place"),
        Opt("--await-sync", kind=FLAG, help="after the request, wait for the line `synced` (the client's work "
                                            "tree transfer) before the run is kept; anything else: nothing is"),
        Opt("--waits-by-caller", kind=FLAG, help="the caller's machine records the run's wait (a remote "
                                                 "caller: this host's wait ledger is not its)"),
        Opt("--hosts", metavar="JSON", convert=_reach,
            help="late-bound over these hosts, reached over ssh from here (transports/kept.Reach): the run's "
                 "process here holds a reservation on each"),
        *slurm_options(),
    ],
)


ATTACH = Parser(
    prog="slotq host attach", usage="slotq host attach RUN_ID [options]", command="positional",
    description="Attach to a kept run of yours: its stream on stdout, from where the last attacher left off, "
                "until it ends or --for passes. Used by transports, not by people.",
    options=[
        Opt("--for", dest="attach_for", metavar="D", convert=duration(allow_zero=True), help="stay attached at most D"),
        Opt("--from-start", kind=FLAG, help="the output from its start, not from where the last attacher left off"),
        Opt("--renew", kind=FLAG, help="only renew the run's lease, and say so in one line"),
    ],
)


def keep(args: list[str]) -> int:
    from slotq.cli.hostrequest import request_from_stdin
    from slotq.config import state_dir_from_env
    from slotq.host import follow, kept
    from slotq.records import from_json

    opts, _ = KEEP.parse(args)
    spec, _rest = request_from_stdin(state_dir_from_env(), opts.await_sync)
    if spec is None:
        return 0  # the transfer failed or the client is gone: nothing is kept
    # The run's log is in the base protocol, whichever the client chose: its
    # attachers, of any release, read it through follow.py's own header.
    spec.protocol = None
    follow.prune()
    path = kept.make_run_dir(spec.run_id)
    terms = {"request": from_json(spec.to_request().decode(), 6), "lease_s": opts.lease or kept.LEASE_S,
             "log_max": opts.log_max or kept.KEPT_MAX_BYTES, "idle": opts.idle, "credit_dir": opts.credit_dir,
             "queued_since": spec.submitted or time.time(), "kill_grace": spec.kill_grace,
             "state_dir": state_dir_from_env(),
             "ledger": not opts.waits_by_caller,
             "slurm": list(opts.slurm_option or []) if opts.slurm else None, "hosts": opts.hosts}
    kept.write_file(os.path.join(path, "request"), kept.to_json_line(terms))
    kept.renew(path)
    _start(path, spec, terms)
    _sigpipe()
    follow.follow(path, 1, 0, opts.attach_for, opts.detach, from_start=True)
    return 0


def _start(path: str, spec: RunSpec, terms: dict[str, object]) -> None:
    """The run's own process: a new session, which holds `alive` for its life."""
    import fcntl

    from slotq.host import kept

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setsid()
            if os.fork():
                os._exit(0)
            alive = kept.lock_file(os.path.join(path, "alive"), fcntl.LOCK_EX)
            os.write(w, b"1" if alive is not None else b"")
            os.close(w)
            if alive is None:
                return  # (said: the caller's error)
            null = os.open(os.devnull, os.O_RDWR)
            err = os.open(os.path.join(path, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(err, 2)
            from slotq.client.standin import run_kept

            run_kept(path, spec, terms, alive)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    ok = os.read(r, 1)
    os.close(r)
    if not ok:
        from slotq.errors import HostUnavailable

        raise HostUnavailable(f"the kept run's process could not start ({path})", os.uname().nodename)


def keep_back(args: list[str]) -> int:
    """`slotq host keep-back RUN_ID ALIVE_FD`: a kept run back from waiting
    away (host/away.py: its process was a shell meanwhile, the same pid,
    holding the run's `alive` lock on ALIVE_FD and its ticket): its runner
    and stand-in again, its place in line taken back. Run by that shell,
    never by people."""
    import fcntl

    from slotq.client.standin import run_kept
    from slotq.config import state_dir_from_env
    from slotq.host import kept
    from slotq.records import to_json
    from slotq.spec import RunSpec, is_run_id
    from slotq.transports import away

    if len(args) != 2 or not is_run_id(args[0]) or not args[1].isdigit():
        raise UsageError("usage: slotq host keep-back RUN_ID ALIVE_FD (run by a kept run's shell)")
    run_id, alive = args[0], int(args[1])
    try:
        path = kept.open_run_dir(run_id)
        st, named = os.fstat(alive), os.lstat(os.path.join(path, "alive"))
        if (st.st_dev, st.st_ino) != (named.st_dev, named.st_ino):
            raise UsageError(f"descriptor {alive} is not run {run_id}'s alive lock")
        fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: a no-op; another's: refused
        os.set_inheritable(alive, False)
        terms = kept.read_request(path)
        spec = RunSpec.from_request(to_json(terms.get("request")).encode())
        back = away.back(state_dir_from_env())
    except (kept.KeptError, OSError, ValueError, away.BackError) as e:
        raise UsageError(f"run {run_id} cannot come back: {getattr(e, 'strerror', None) or e}") from None
    if back is None:
        raise UsageError(f"run {run_id} was not waiting away (no ${away.ENV})")
    from slotq import signals
    from slotq.host.away import SIGUSR1

    signals.signal(SIGUSR1, signals.SIG_IGN)  # `slotq cancel`'s wake-up, if it comes late
    run_kept(path, spec, terms, alive, back)
    return 0


def attach(args: list[str]) -> int:
    from slotq.cli.args import run_id_and_options
    from slotq.host import follow, kept

    run_id, opts = run_id_and_options(ATTACH, args)
    if opts.renew:
        try:
            kept.renew(kept.open_run_dir(run_id))
        except kept.KeptError as e:
            raise UsageError(str(e)) from None
        import sys

        sys.stdout.write(f"slotq: the lease of run {run_id} starts again now\n")
        return 0
    _sigpipe()
    follow.attach(run_id, 1, 0, opts.attach_for, opts.from_start)
    return 0


def _sigpipe() -> None:
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # our client gone: we go too (the run does not)
