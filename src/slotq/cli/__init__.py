"""The `slotq` command. One module per subcommand, each thin: parse, call
the library, map the outcome to an exit code through one table. Modules are
imported only for the subcommand used, to keep start-up fast."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

USAGE = """\
usage: slotq <command> [options]

Run a verification command on a shared test machine through a fair slot
queue. Waiting in line is never charged to the command's budget.

commands:
  run      run a command when a slot is free:   slotq run --budget 10m -- pytest -q
  attach   come back to a kept run (run --attach-for / --detach):  slotq attach RUN_ID --for 100s
  status   show pools, slot holders, the waiting line and recent runs
  cancel   cancel queued or running runs of yours:  slotq cancel RUN_ID | --label PAT | --mine
  task     run a whole job under a budget that recorded waits extend:
           slotq task --budget 30m --credit-dir . -- python agent.py
  waits    what a work dir waited for, and when (the wait ledger)
  history  finished runs on this host, sacct-like:  slotq history --since 7d --user alice
  report   a timeline page of the runs:  slotq report --html runs.html --since 7d
  metrics  the queue for Prometheus:  slotq metrics [--textfile DIR]
  completion  print a shell completion script:  slotq completion bash|zsh|fish
  mcp      serve the queue to an agent's harness over MCP (stdio; pip install mcp, or from a clone pip install '.[mcp]')
  host     the pool owner's (host drain, resume, check, init) and the transports' (host run ...)

Run `slotq <command> --help` for its options. Exit codes: see `slotq run --help`.
"""

EX_USAGE = 64  # a bad command line (sysexits; errors.UsageError's code)

COMMANDS = {"run": "slotq.cli.run", "attach": "slotq.cli.attach", "status": "slotq.cli.status",
            "cancel": "slotq.cli.cancel",
            "task": "slotq.cli.task",
            "waits": "slotq.cli.waits", "history": "slotq.cli.history",
            "report": "slotq.cli.report", "metrics": "slotq.cli.metrics", "completion": "slotq.cli.completion", "mcp": "slotq.cli.mcp",
            "host": "slotq.cli.host"}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] not in (["run"], ["task"], ["attach"]):
        return _main(args)
    # A stop signal from here until the run (or the job) sets its own
    # handlers is a cancel of it (of an attach: its leaving), not slotq's
    # death (signals.hold_stops).
    from slotq.signals import hold_stops, signal

    held = hold_stops()
    try:
        return _main(args)
    finally:
        for sig, handler in held.items():
            signal(sig, handler)  # type: ignore[arg-type]


def _main(args: list[str]) -> int:
    _standard_streams()
    if not args:
        sys.stderr.write(USAGE)  # a mistake, not a request: usage on stderr, exit 64
        return EX_USAGE
    if args[0] == "help" and len(args) == 2 and args[1] in COMMANDS:
        args = [args[1], "--help"]  # `slotq help run`: run's own help
    elif args[0] in ("-h", "--help", "help"):
        return _print(USAGE)
    if args[0] == "--version":
        from slotq import __version__

        return _print(f"slotq {__version__}\n")
    module = COMMANDS.get(args[0])
    if module is None:
        from slotq.cli.args import cut, did_you_mean

        hint = did_you_mean(args[0], COMMANDS) or f" (try: {', '.join(COMMANDS)})"
        sys.stderr.write(f"slotq: error: unknown command {cut(args[0])!r}{hint}\n")
        return EX_USAGE
    if args[0] != "run":
        import gc

        from slotq.records import load_scanner

        gc.enable()  # bin/slotq turns it off for `run`'s start-up only (client/events.collect_from_now_on)
        # Other users' labels in a terminal whose encoding cannot show them
        # (PYTHONIOENCODING=ascii, a Latin-1 locale): '?', not a traceback.
        reconfigure = getattr(sys.stdout, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")
        load_scanner()  # the C JSON scanner: `run` loads it only once it waits (records.py)
        sys.stdout = _Stdout(sys.stdout)
    from slotq.errors import SlotqError

    try:
        code: int = __import__(module, fromlist=["main"]).main(args[1:])
        sys.stdout.flush()  # here, so that a reader gone (EPIPE) is caught below
        return code
    except SlotqError as e:
        sys.stderr.write(f"slotq {args[0]}: error: {e}\n")
        if e.exit_code == 74:
            _reader_gone()  # what is still buffered cannot be written either: nowhere, not at exit
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except OSError as e:
        # Nothing slotq expected: still one line, never a traceback. A full,
        # read-only or over-quota disk is the state dir's problem (73).
        import errno

        where = f" ({e.filename})" if e.filename else ""
        sys.stderr.write(f"slotq {args[0]}: error: {e.strerror or e}{where}\n")
        return 73 if e.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT) else 71


def _print(text: str) -> int:
    """`text` on stdout: 0, or the exit code of a failure, said."""
    from slotq.cli.args import write_out
    from slotq.errors import OutputError

    try:
        write_out(text)
        return 0
    except BrokenPipeError:
        return _reader_gone()
    except OutputError as e:
        sys.stderr.write(f"slotq: error: {e}\n")
        _reader_gone()
        return e.exit_code


class _Stdout:
    """sys.stdout of the commands that print (status, history, waits...),
    whose failures to write (a full disk) say so: OutputError, exit 74 --
    they were read as the state dir's (73). A reader gone stays
    BrokenPipeError: quiet."""

    def __init__(self, inner: "TextIO") -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        from slotq.errors import OutputError

        return OutputError.guard(self._inner.write, text)

    def flush(self) -> None:
        from slotq.errors import OutputError

        OutputError.guard(self._inner.flush)

    def __getattr__(self, name: str) -> object:  # isatty, fileno, encoding...
        return getattr(self._inner, name)


def _standard_streams() -> None:
    """Open /dev/null on each of descriptors 0-2 that the caller left closed
    (`slotq run ... >&-`, a daemon without them). Otherwise the next file or
    pipe slotq opens takes that number, and is read as stdin or written to
    as stdout or stderr: a state file among them (seen: the ticket counter
    and the runner's control pipe on 1). Output to a closed stream then goes
    nowhere, as `>/dev/null` would send it; the run itself is not affected."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            # The interpreter found it closed at start-up and left None here.
            if fd == 1 and sys.stdout is None:
                sys.stdout = open(1, "w", closefd=False)
            elif fd == 2 and sys.stderr is None:
                sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)


def _reader_gone() -> int:
    """Our stdout's reader went away (`slotq status --json | head -c1`):
    end quietly, as Unix tools do when SIGPIPE ends them (128 + 13). What
    is still buffered goes nowhere."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 141
