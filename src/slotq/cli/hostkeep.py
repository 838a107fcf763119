"""`slotq host keep` and `slotq host attach`: the host side of kept runs
(host/kept.py), as the client's transport starts them (transports/kept.py).

`host keep` reads the run's request on stdin, makes the run's directory,
starts the run's own process (a new session: it outlives this one and the
caller; client/standin.py) and then attaches to it, as `host attach` does:
the stream on stdout until the run ends, `--attach-for` passes, or (with
`--detach`) the run has its place.
"""

from __future__ import annotations

import os
import time

from slotq.cli.args import FLAG, Opt, Parser, duration, positive_int
from slotq.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slotq.spec import RunSpec

KEEP = Parser(
    prog="slotq host keep", usage="slotq host keep --request-stdin [options]",
    description="Start a kept run (it outlives this process and its caller) from the request on stdin, then "
                "attach to it: its stream on stdout. Used by transports, not by people.",
    options=[
        Opt("--request-stdin", kind=FLAG, required=True, help="read the request as one JSON line from stdin"),
        Opt("--lease", metavar="D", convert=duration(), help="how long the run waits for an attacher to come back"),
        Opt("--log-max", metavar="BYTES", convert=positive_int, help="the bound of the run's output log"),
        Opt("--idle", metavar="D", convert=duration(), help="the no-output watchdog, from the command's start"),
        Opt("--credit-dir", metavar="DIR", help="record the run's wait in the wait ledger under DIR"),
        Opt("--attach-for", metavar="D", convert=duration(allow_zero=True), help="stay attached at most D"),
        Opt("--detach", kind=FLAG, help="stay attached only until the run has its place"),
        Opt("--await-sync", kind=FLAG, help="after the request, wait for the line `synced` (the client's work "
                                            "tree transfer) before the run is kept; anything else: nothing is"),
        Opt("--waits-by-caller", kind=FLAG, help="the caller's machine records the run's wait (a remote "
                                                 "caller: this host's wait ledger is not its)"),
    ],
)

ATTACH = Parser(
    prog="slotq host attach", usage="slotq host attach RUN_ID [options]", command="optional",
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
    from slotq.host import kept
    from slotq.records import from_json

    opts, _ = KEEP.parse(args)
    spec, _rest = request_from_stdin(state_dir_from_env(), opts.await_sync)
    if spec is None:
        return 0  # the transfer failed or the client is gone: nothing is kept
    _prune()
    path = kept.make_run_dir(spec.run_id)
    terms = {"request": from_json(spec.to_request().decode(), 6), "lease_s": opts.lease or kept.LEASE_S,
             "log_max": opts.log_max or kept.KEPT_MAX_BYTES, "idle": opts.idle, "credit_dir": opts.credit_dir,
             "queued_since": spec.submitted or time.time(), "kill_grace": spec.kill_grace,
             "ledger": not opts.waits_by_caller}
    kept.write_file(os.path.join(path, "request"), kept.to_json_line(terms))
    kept.renew(path)
    _start(path, spec, terms)
    until = None if opts.attach_for is None else time.monotonic() + opts.attach_for
    return _follow(path, until, opts.detach, from_start=True)


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
            null = os.open(os.devnull, os.O_RDWR)
            err = os.open(os.path.join(path, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(err, 2)
            from slotq.client.standin import run_kept

            run_kept(path, spec, terms)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    ok = os.read(r, 1)
    os.close(r)
    if not ok:
        from slotq.errors import HostUnavailable

        raise HostUnavailable(f"the kept run's process could not start ({path})", os.uname().nodename)


def attach(args: list[str]) -> int:
    from slotq.cli.args import run_id_and_options
    from slotq.host import kept

    run_id, opts = run_id_and_options(ATTACH, args)
    _prune()
    try:
        path = kept.open_run_dir(run_id)
    except kept.KeptError as e:
        return _from_history(run_id, str(e))
    if opts.renew:
        kept.renew(path)
        import sys

        sys.stdout.write(f"slotq: the lease of run {run_id} starts again now\n")
        return 0
    until = None if opts.attach_for is None else time.monotonic() + opts.attach_for
    return _follow(path, until, False, from_start=opts.from_start)


def _follow(path: str, until: float | None, until_placed: bool, from_start: bool) -> int:
    import signal

    from slotq.host.follow import Follower

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # our client gone: we go too (the run does not)
    if Follower(path, 1, 0, from_start=from_start).follow(until, until_placed):
        _result_taken(path)
    return 0


def _result_taken(path: str) -> None:
    """The run's result was delivered: its directory goes, once its process
    is gone and nobody else is attached (else the next prune takes it)."""
    from slotq.host import kept

    kept.write_file(os.path.join(path, "taken"), b"")
    _until_gone(os.path.join(path, "alive"), 5.0)  # it writes its history line, then goes: a moment
    _remove_if_done(path)


def _until_gone(lock: str, seconds: float) -> None:
    """Wait (at most `seconds`) until nobody holds `lock`."""
    import fcntl

    from slotq.history import lock_within

    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if lock_within(fd, fcntl.LOCK_SH, seconds):
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _remove_if_done(path: str) -> None:
    import fcntl
    import shutil

    from slotq.host import kept

    if kept.held(os.path.join(path, "alive")):
        return
    attached = kept.lock_file(os.path.join(path, "attached"), fcntl.LOCK_EX)
    if attached is None:
        return
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(attached)


def _prune() -> None:
    """Kept runs whose result was taken, or that ended longer ago than the
    history keeps runs, go."""
    from slotq.config import HostConfig
    from slotq.host import kept

    root = kept.kept_root()
    try:
        names = os.listdir(root)
    except OSError:
        return
    retention = HostConfig.load().retention
    now = time.time()
    for name in names[:10_000]:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if os.path.exists(os.path.join(path, "taken")) or now - st.st_mtime > retention:
            _remove_if_done(path)


def _from_history(run_id: str, why: str) -> int:
    """A run whose directory is gone: its result from the history, as a
    stream (hello, its phases, exited); or an error saying there is none."""
    import sys

    from slotq import __version__, protocol
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.history.index import Index

    state_dir = state_dir_from_env()
    config = HostConfig.load(state_dir=state_dir)
    index = Index(state_dir, config.retention)
    try:
        index.catch_up()
        found = [r for r in index.query() if r.get("run_id") == run_id]
    finally:
        index.close()
    out = [protocol.MAGIC]
    now = time.time()

    def event(name: str, at: object, **fields: object) -> None:
        out.append(protocol.event_frame(name, float(at) if isinstance(at, (int, float)) else now, **fields))

    if not found:
        event(protocol.HELLO, now, protocol=protocol.PROTOCOL_VERSION, version=__version__)
        event(protocol.ERROR, now, kind="usage", message=f"{why} (nor in its history)")
    else:
        rec = found[-1]
        ph: dict[str, object] = rec["phases"]  # type: ignore[assignment]
        request = {"argv": ["?"], "run_id": run_id, "label": rec.get("label"), "cls": rec.get("class"),
                   "submitted": ph.get("submitted")}
        event(protocol.HELLO, now, protocol=protocol.PROTOCOL_VERSION, version=__version__,
              request={k: v for k, v in request.items() if v is not None})
        if ph.get("slot") is not None:
            event(protocol.SLOT, ph["slot"], slot=str(rec.get("slot") or "?"))
        if ph.get("started") is not None:
            event(protocol.STARTED, ph["started"])
        code = rec.get("exit_code")
        event(protocol.EXITED, ph.get("ended"), outcome=str(rec.get("outcome")),
              exit_code=code if isinstance(code, int) else None, message=str(rec.get("message") or ""),
              phases={k: v for k, v in ph.items() if k in ("slot", "prepared", "started", "ended")})
    sys.stdout.buffer.write(b"".join(out))
    sys.stdout.flush()
    return 0
