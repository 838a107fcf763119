"""`slotq host ...`: the host side, as transports launch it (HELP below says
what each command does). `slotq host run --request-stdin` reads the request
(argv and options) as the first line of stdin, so no shell ever sees it;
with `--slurm-job` the Slurm allocation is the slot (no local queue).
"""

from __future__ import annotations

import os
import sys

from slotq.cli.args import FLAG, RUN_OPTIONS, Opt, Parser, current_dir
from slotq.cli.hostrequest import request_from_stdin, work_root
from slotq.errors import UsageError


def _run_id(text: str) -> str:
    from slotq.spec import is_run_id

    if not is_run_id(text):
        raise ValueError(f"{text!r} is not a run id (1..64 letters and digits)")
    return text


PARSER = Parser(
    prog="slotq host run", usage="slotq host run [options] (--request-stdin | -- CMD [ARGS...])",
    command="optional",
    description="Host side of one run: queue, slot, command, framed stream on stdout; stdin is the "
                "caller's channel (end-of-file: the caller is gone). Used by transports, not by people.",
    options=[
        *RUN_OPTIONS,
        Opt("--run-id", metavar="ID", convert=_run_id, help="the run's id, 1..64 letters and digits "
                                                            "(default: a new one)"),
        Opt("--cwd", metavar="DIR", help="work dir of the command (default: the current one)"),
        Opt("--request-stdin", kind=FLAG, help="read the request as one JSON line from stdin (remote transports)"),
        Opt("--await-sync", kind=FLAG, help="with --request-stdin: after the request, wait for the line "
                                            "`synced` (the client's work tree transfer, run meanwhile) before "
                                            "joining the line; anything else ends the run unrecorded"),
        Opt("--slurm-job", kind=FLAG, help="run inside the Slurm job named by $SLURM_JOB_ID: the allocation is "
                                           "the slot, no local queue (the Slurm transport)"),
    ],
)


HELP = {
    None: """\
usage: slotq host <init | check | drain | resume | hello | reap | run | keep | attach> ...

The host side. The pool's owner runs `init` (as root), `check`, `drain`
and `resume` (docs/operating.md); transports run the others on the test
host, over ssh or in a Slurm job.

  init --shared DIR --group G   as root: a state dir the members of G share
                                safely (`slotq host init --help`)
  check                         after setting up or changing the machine:
                                each finding one line, with its fix
  drain [POOL...] --reason T    as the owner: start no new command in the
                                pools until `resume`; running ones finish,
                                waiting ones keep their places
  resume [POOL...]              as the owner: start commands again, in
                                line order
  hello                         one JSON line: version, stream protocols,
                                state layout, state dir, work root
  reap RUN_ID                   after a runner vanished: what became of its
                                command; its leftover processes are ended
                                (same user only)
  run [options] -- CMD          the runner of one run; stdin is the caller's
                                channel (`slotq host run --help`)
  keep --request-stdin          start a kept run (it outlives its caller:
                                `slotq run --attach-for`), then attach to it
  attach RUN_ID [--for D]       a kept run's stream, from where its last
                                attacher left off (`slotq attach`)
  away-gone                     a run that waited away died: close its wait
                                and bury its ticket (started by the run's
                                watcher, with $SLOTQ_AWAY_GONE)
  keep-back RUN_ID FD           a kept run back from waiting away (run by
                                its shell, with $SLOTQ_AWAY)
""",
    "hello": """\
usage: slotq host hello

Print one JSON line: slotq's version, the stream protocols it speaks
(`protocols`; `protocol` is the one it speaks to a client that names none),
the state dir's layout, this host's name, its state dir and your work root
(where remote work trees are synced). The ssh transport reads it first, and
chooses the newest protocol both sides speak.
""",
    "reap": """\
usage: slotq host reap RUN_ID

After a run's runner vanished (the client lost its stream): say in one line
what became of the run's command on this host. If its runner and keeper are
both gone, the command is ended (TERM, grace, KILL) -- if it is yours; a
keeper still ending it is waited for.
""",
}


def main(args: list[str]) -> int:
    sub = args[0] if args and args[0] in ("hello", "reap") else None
    if args[:1] in (["-h"], ["--help"]) or (sub and args[1:] and args[1] in ("-h", "--help")):
        sys.stdout.write(HELP[sub])
        return 0
    if args[:1] == ["check"]:
        from slotq.cli.hostcheck import main as check

        return check(args[1:])
    if args[:1] in (["drain"], ["resume"]):
        from slotq.cli.hostdrain import main as drain

        return drain(args[1:], resume=args[0] == "resume")
    if args[:1] == ["init"]:
        from slotq.cli.hostinit import main as init

        return init(args[1:])
    if args == ["hello"]:
        return hello()
    if args == ["away-gone"]:
        return away_gone()
    if args[:1] in (["keep"], ["attach"], ["keep-back"]):
        from slotq.cli import hostkeep

        run = {"keep": hostkeep.keep, "attach": hostkeep.attach, "keep-back": hostkeep.keep_back}[args[0]]
        return run(args[1:])
    if args[:1] == ["reap"]:
        if len(args) != 2 or not (args[1].isalnum() and args[1].isascii()):
            raise UsageError("usage: slotq host reap RUN_ID")
        return reap(args[1])
    if args[:1] == ["hello"]:
        raise UsageError("usage: slotq host hello (it takes no options)")
    if not args or args[0] != "run":
        what = f"unknown host command {args[0]!r}" if args else "name a host command"
        raise UsageError(f"{what}: init, check, drain, resume, hello, reap, run, keep or attach "
                         "(see `slotq host --help`)")
    opts, command = PARSER.parse(args[1:])
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.host.runner import Arrival, HostRunner
    from slotq.spec import RunSpec

    state_dir = state_dir_from_env()
    config = HostConfig.load(state_dir=state_dir)
    leftover = b""
    if opts.request_stdin:
        got, leftover = request_from_stdin(state_dir, opts.await_sync)
        if got is None:
            return 0  # the transfer failed or the client is gone: nothing was queued
        spec = got
    else:
        if not command:
            raise PARSER.error("no command given (or --request-stdin)")
        spec = RunSpec(command, cls=opts.cls or "shared", budget=opts.budget, prepare=opts.prepare,
                       prepare_timeout=opts.prepare_timeout, label=opts.label, report_every=opts.report_every,
                       kill_grace=opts.kill_grace, cwd=opts.cwd or current_dir(), run_id=opts.run_id,
                       max_wait=opts.max_wait)
    allocation = None
    if opts.slurm_job:
        job = os.environ.get("SLURM_JOB_ID", "")
        if not job.isdigit():
            raise UsageError("--slurm-job: not inside a Slurm job ($SLURM_JOB_ID is not set)")
        allocation = f"slurm job {job}"
    HostRunner(spec, state_dir=state_dir, config=config, in_fd=0, out_fd=1, ctl_buffer=leftover,
               arrival=Arrival(allocation)).run()
    return 0



def reap(run_id: str) -> int:
    """The client lost its runner's stream: say what became of the run's
    command here, and end it if runner and keeper are both gone (ours). A
    keeper still ending it is waited for (its grace, plus a moment)."""
    import time

    from slotq.config import HostConfig, state_dir_from_env
    from slotq.host.orphans import end_orphan, holder_state
    from slotq.host.proclocks import held
    from slotq.host.slot import read_slot, slot_path

    state_dir = state_dir_from_env()
    config = HostConfig.load(state_dir=state_dir)

    def find() -> tuple[dict[str, object], str] | None:
        locked = held()
        for pool, count in config.pools.items():
            for i in range(count):
                is_held, info = read_slot(state_dir, pool, i, locked)
                if is_held and info and info.get("run_id") == run_id:
                    return info, slot_path(state_dir, pool, i)
        return None

    found = find()
    if found is None:
        print("nothing of the run holds a slot here any more")
        return 0
    info, path = found
    state = holder_state(info)
    if state == "stopping":
        grace = info.get("grace")
        end = time.monotonic() + (float(grace) if isinstance(grace, (int, float)) else config.kill_grace) + 2
        while find() is not None and time.monotonic() < end:
            time.sleep(0.02)  # product code: bounded wait for the keeper to finish
        gone = find() is None
        print(f"its runner (pid {info.get('pid')}) was gone; its keeper (pid {info.get('keeper')}) "
              + ("ended the command" if gone else "is still ending the command"))
    elif state == "orphaned":
        ended = end_orphan(state_dir, info, config.kill_grace, by="its caller (slotq host reap)", path=path)
        print(f"its runner (pid {info.get('pid')}) and keeper (pid {info.get('keeper')}) were both gone; "
              + (f"slotq ended the orphaned command (pids {', '.join(map(str, ended))})" if ended
                 else "its orphaned command belongs to another user and was left alone"))
    else:
        print(f"its runner (pid {info.get('pid')}) is still there ({state})")
    return 0


def hello() -> int:
    from slotq import __version__, protocol
    from slotq.config import state_dir_from_env
    from slotq.host.hostqueue import ensure_state_dir
    from slotq.host.layout import layout_of
    from slotq.records import to_json

    state_dir = state_dir_from_env()
    ensure_state_dir(state_dir)
    root = work_root(state_dir)
    # `protocol`: what a client that names none gets (the previous
    # release's clients check it); `protocols`: the range this host speaks.
    sys.stdout.write(to_json({"slotq": __version__, "protocol": protocol.BASE,
                              "protocols": [protocol.PROTOCOLS[0], protocol.PROTOCOLS[-1]],
                              "layout": layout_of(state_dir),
                              "host": os.uname().nodename, "state_dir": state_dir,
                              "work_root": root}) + "\n")
    return 0



def away_gone() -> int:
    """`slotq host away-gone`: the watcher's lock came -- the run died away.
    Close its wait record now and bury its ticket (its history line)."""
    import time

    from slotq.host.away import ENV_GONE, MAX_ENV
    from slotq.records import from_json

    raw = os.environ.get(ENV_GONE, "")
    try:
        what = from_json(raw, max_depth=2) if 0 < len(raw) <= MAX_ENV else None
    except ValueError:
        what = None
    if not isinstance(what, dict) or not all(isinstance(what.get(k), str) for k in
                                             ("path", "run_id", "ledger", "workdir", "host")) \
            or not isinstance(what.get("fd"), int):
        sys.stderr.write(f"slotq host away-gone: error: ${ENV_GONE} is missing or malformed\n")
        return 64
    now = time.time()
    try:
        st = os.fstat(int(what["fd"]))
        named = os.lstat(str(what["path"]))
    except OSError as e:
        sys.stderr.write(f"slotq host away-gone: error: {what['path']}: {e.strerror or e}\n")
        return 1
    from slotq.host.proclocks import holder_pids

    # Only for a ticket whose lock our watcher (our parent) holds now: its
    # run is dead. Never a live run's, whatever the environment says.
    if (st.st_dev, st.st_ino) != (named.st_dev, named.st_ino) or \
            holder_pids(st.st_dev, st.st_ino) != [os.getppid()]:
        sys.stderr.write(f"slotq host away-gone: error: the lock of {what['path']} is not held by this "
                         "watcher: nothing done\n")
        return 1
    if what["ledger"]:  # (none: a kept run whose wait its remote caller records)
        from slotq.client.ledger import WaitRecorder

        WaitRecorder(run_id=str(what["run_id"]), workdir=str(what["workdir"]), host=str(what["host"]),
                     path=str(what["ledger"]), warn=lambda line: None).closer("queue")(now)
    from slotq.host.line import bury

    bury(str(what["path"]), int(what["fd"]))
    return 0
