"""`slotq run`: run a command on the host when a slot is free."""

from __future__ import annotations

import os

from slotq.cli.args import (FLAG, RUN_OPTIONS, JsonResult, Namespace, Opt, Parser, check_dir, current_dir, duration,
                            host_options, positive_int, slurm_options, ssh_transport, use_slurm, byte_size)
from slotq.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from slotq.client.result import RunResult
    from slotq.config import HostConfig
    from slotq.spec import RunSpec
    from slotq.transports.base import Transport
    from slotq.transports.local import LocalTransport
    from slotq.transports.ssh import SshTransport

EPILOG = """\
outcomes and exit codes:
  passed          the command exited 0                       0
  failed          the command exited non-zero                its own code (127: not found)
  exec_timeout    ran past --budget after it started         124
  idle_timeout    printed nothing for --idle after start     123
  backstop        slot held, host silent past budget + 90s   122
  unavailable     host unreachable / no resource / state     121
  prepare_failed  the --prepare step failed                  120
  cancelled       Ctrl-C / SIGTERM / SIGHUP / slotq cancel   130
                  (a signal slotq was started with ignored, as
                  nohup's SIGHUP, stays ignored)
  caller_gone     the caller vanished (seen in host history) 129
  not_admitted    an admission policy turned it away         117
                  (--max-wait, the host's [admission] limits, or a run
                  started inside a run that holds its pool's slot)
  detached        not finished yet: the caller left a kept run 75
                  (--attach-for, `slotq attach --for`), which goes on;
                  `slotq attach RUN_ID` comes back to it
  bad arguments 64 (EX_USAGE; not 2, which make and pytest use), bad host
  config 78, unusable state directory 73, a remote run's work tree with a
  file you cannot read 66. A passed or failed run exits with the command's
  own code, so any code may come from the command: --json's `outcome` says
  which it was (slotq's own are 64-78 and 117-124, 129, 130 above)

environment: SLOTQ_STATE_DIR (the host's queue and history), SLOTQ_CONFIG (host config TOML),
             SLOTQ_LEDGER (your wait ledger, SQLite; your kept runs, MCP output and history
             index go beside it, not in SLOTQ_STATE_DIR), SLOTQ_SSH_CONFIG, SLOTQ_REMOTE_SLOTQ,
             SLOTQ_BACKEND=slurm (as --slurm), SLOTQ_ATTACH_FOR=D (as --attach-for D for
             every run: set it once in an agent harness whose tool calls are stopped
             after a fixed time; also [defaults] attach_for in your config)
"""


def _run_id(text: str) -> str:
    from slotq.spec import is_run_id

    if not is_run_id(text) or not text:
        raise ValueError(f"{text[:80]!r} is not a run id (1-64 ASCII letters and digits)")
    return text


JUNIT_OPTION = Opt("--junit", metavar="FILE",
                   help="write the run as a JUnit XML report to FILE: one test case, a failure for the work's "
                        "outcomes, an error for the infrastructure's, skipped if not admitted (docs/ci.md)")


class Reports:
    """The reports of a run beside its status lines: its CI system's
    (client/ci.py: under GITHUB_ACTIONS or GITLAB_CI, the waiting lines in
    a group and, on GitHub, the outcome as an annotation, a step summary
    row and step outputs) and --junit FILE. `say`: the status lines as
    they are to be said (None: quiet)."""

    def __init__(self, junit: str | None, say: "Callable[[str], None] | None") -> None:
        if junit == "-":
            raise UsageError("--junit needs a file name")
        self.junit = None if junit is None else JsonResult(junit, option="--junit")
        self.say, self.ci = say, None
        if os.environ.get("GITHUB_ACTIONS") == "true" or os.environ.get("GITLAB_CI") == "true":
            from slotq.client.ci import wrap

            self.say, self.ci = wrap(say, _stderr_line)

    def done(self, result: "RunResult") -> None:
        if self.ci is not None:
            self.ci.finish(result)
        if self.junit is not None:
            from slotq.client.ci import junit

            self.junit.write(lambda one_line: junit(result))

    def discard(self) -> None:
        if self.junit is not None:
            self.junit.discard()


PARSER = Parser(
    prog="slotq run", usage="slotq run [options] -- CMD [ARGS...]", command="required",
    description="Run CMD on the test host when a slot is free. Queued callers keep their place; the "
                "budget starts when the command starts. CMD's stdout and stderr are passed through as they "
                "are; its stdin is /dev/null (it may run on another machine, after a wait).",
    epilog=EPILOG,
    options=[
        *RUN_OPTIONS,
        Opt("--idle", metavar="D", convert=duration(),
            help="stop the command if it prints nothing for D after it started"),
        Opt("--json", metavar="FILE", help="write the result as JSON to FILE (- for stdout: one compact line, the "
                                            "last, after the command's own output: `tail -1 | jq`)"),
        JUNIT_OPTION,
        Opt("--run-id", metavar="ID", convert=_run_id,
            help="the run's id (1-64 letters and digits; default: a new random one), for a harness that names "
                 "its runs before they start; it must be new: status, cancel, attach and the history know a run "
                 "by it"),
        Opt("--credit-dir", metavar="DIR",
            help="record the wait in the wait ledger under DIR, for `slotq task` and other outer runners "
                 "to credit (default: the current directory)"),
        Opt("-q", "--quiet", kind=FLAG,
            help="no status lines, but the one line of an ending slotq decided (a timeout, unavailable, "
                 "cancelled...) or of a command that could not start; a quiet run far back in a slow line waits "
                 "at almost no memory or CPU (docs/usage.md)"),
        Opt("--attach-for", metavar="D", convert=duration(allow_zero=True),
            help="keep the run (it outlives this call) and stay attached at most D: if it has not ended "
                 "by then, leave it with one line naming its run id and `slotq attach RUN_ID`, exit 75; it "
                 "keeps its place and its clocks (for tool calls a harness kills after a fixed time; a stop "
                 "signal leaves it too, `slotq cancel` gives it up)"),
        Opt("--detach", kind=FLAG, help="keep the run and leave it as soon as it has its place in line: "
                                        "prints its run id on stdout, exit 0"),
        Opt("--no-attach", kind=FLAG,
            help="a plain run, whatever $SLOTQ_ATTACH_FOR or [defaults] attach_for say: it ends with its "
                 "caller"),
        Opt("--lease", metavar="D", convert=duration(minimum=1.0),
            help="a kept run waits this long for someone to attach again (every attach renews it); then it "
                 "ends as caller_gone: withdrawn if waiting, stopped if running (default: 15m; 1s to 30d)"),
        Opt("--log-max", metavar="SIZE", convert=byte_size,
            help="a kept run's output is logged for attachers up to SIZE (e.g. 64M, the default); past it "
                 "the middle is dropped, its head and tail kept"),
        *host_options(several="several: a place in every host's line, the first slot won is taken "
                              "(the others are withdrawn at once), and the work tree goes there"),
        Opt("--spread", metavar="N", convert=positive_int, needs=("--host", "says over how many hosts"),
            help="with several --host: wait on the N of them with the shortest expected wait (default: all; "
                 "1: pick one host and stay there)"),
        *slurm_options(),
        Opt("--sync", metavar="MODE", default="rsync", choices=("rsync", "none"),
            needs=("--host", "says how the work tree reaches --host"),
            help="with --host: rsync the current directory to a work dir on the host (default; .gitignore "
                 "respected, deletions propagate), or none (a shared filesystem)"),
    ],
)


def main(args: list[str]) -> int:
    opts, command = PARSER.parse(args)
    config = _attach_default(opts)
    if opts.run_id is not None and not opts.host and not use_slurm(opts):
        check_new_run_id(opts.run_id)
    class_given = opts.cls is not None
    opts.cls = opts.cls or "shared"
    if opts.credit_dir is not None:
        check_dir("--credit-dir", opts.credit_dir)  # as `slotq task` and `slotq waits` check it
    from slotq.config import ledger_env_path

    ledger_env_path()  # the ledger is read only if the run waits: a bad value is said now, not mid-line
    if opts.detach or opts.attach_for is not None or opts.lease is not None or opts.log_max is not None:
        return _kept(opts, command)
    from slotq.transports.base import Transport

    say = None if opts.quiet else _stderr_line
    live = None
    report_every = opts.report_every
    if not opts.quiet and _terminal():
        # A terminal: one waiting line, updated every second, replaced by
        # the slot line. A pipe or a CI log gets the plain lines as always.
        line = LiveLine()
        say, live = line.say, line.update
        report_every = min(report_every, 1.0)
    transport: Transport
    local: LocalTransport | None = None
    if use_slurm(opts):
        from slotq.config import HostConfig
        from slotq.transports.slurm import SlurmTransport

        slurm = SlurmTransport(HostConfig.load(), options=opts.slurm_option)
        slurm.job_for(opts.cls)  # an unmapped class: exit 64 before anything is submitted
        transport = slurm
    elif opts.host:
        if opts.sync == "rsync":
            from slotq.transports.ssh import check_work_tree

            check_work_tree(current_dir())  # before any host is asked
        try:
            transport = _remote(opts)
        except _ChoiceStopped as stop:
            return _cancelled_while_choosing(opts, _spec(opts, command, report_every), stop)
    else:
        transport = local = _local(opts.cls, class_given, config)
    spec = _spec(opts, command, report_every)
    if local is not None:
        local.come_back(spec)  # a run that waited away (host/away.py) takes back its place and run id
    cwd = str(spec.cwd)
    json_result = JsonResult(opts.json)  # a bad --json path is a usage error before the run joins the line
    reports = Reports(opts.junit, say)  # ... and a bad --junit path
    if local is not None and not local.came_back and not spec.prepare:
        from slotq.host.child import unrunnable

        problem = unrunnable(command[0], cwd)
        if problem is not None:  # a typo fails now, not after its turn in line
            return CannotStart(spec, problem).tell(json_result)
    transport.reserve(spec)  # join the host's line before the rest of slotq loads, where a transport can
    from slotq.client.caller import run

    # Its slot free, the command starts now, and the runner loads meanwhile.
    # (After the client: loaded later, in a process the command's keeper
    # was just forked from, its pages cost a copy each; about 0.4 ms.)
    transport.start_early(spec)

    try:
        result = run(spec, transport, idle=opts.idle, status=reports.say, handle_sigint=True,
                     credit_dir=opts.credit_dir or cwd, live=live)
        if opts.quiet and result.said_when_quiet:
            from slotq.client.result import summary_line

            _stderr_line(summary_line(result))
        _keep_place_hint(result)
        reports.done(result)
        json_result.write(result.to_json, open_line=result.open_line)
    finally:
        json_result.discard()  # no result (an error escaped): no file, and the old one untouched
        reports.discard()
    return result.exit_code


def _attach_default(opts: Namespace) -> "HostConfig | None":
    """A run that says neither --attach-for nor --detach nor --no-attach is
    kept if $SLOTQ_ATTACH_FOR or your config's [defaults] attach_for says
    so (an agent harness sets it once for every `slotq run` it starts).
    The config read for it, if one was, for the rest of the run to use."""
    if opts.no_attach:
        if opts.attach_for is not None or opts.detach:
            raise UsageError("--no-attach is a plain run: leave out --attach-for/--detach, or --no-attach")
        if opts.lease is not None or opts.log_max is not None:
            raise UsageError("--lease and --log-max are for a kept run, and --no-attach makes a plain one")
        return None
    if opts.attach_for is not None or opts.detach:
        return None
    env = os.environ.get("SLOTQ_ATTACH_FOR")
    if env is not None:
        try:
            opts.attach_for = duration(allow_zero=True)(env)
        except ValueError as e:
            raise UsageError(f"SLOTQ_ATTACH_FOR={env[:40]!r}: {e}") from None
        return None
    if use_slurm(opts) or opts.host:
        from slotq.config import HostConfig

        opts.attach_for = HostConfig.load().attach_for  # (yours: the host's config is the host's)
        return None
    from slotq.config import HostConfig

    config = HostConfig.load()
    opts.attach_for = config.attach_for
    return config


def _keep_place_hint(result: "RunResult") -> None:
    """A plain run stopped in line (it had a ticket, not yet a slot) lost its
    place with its call: say how to keep it next time (a harness that kills
    its calls after a fixed time). Stopped before its ticket, it had no place."""
    from slotq.outcome import KEEP_PLACE, Outcome

    if result.outcome is Outcome.CANCELLED and result.ticket is not None and result.phases.get("slot") is None:
        _stderr_line(f"slotq: {KEEP_PLACE}")


def _local(cls: str, class_given: bool, config: "HostConfig | None" = None) -> "LocalTransport":
    """This machine's transport, for a run of class `cls` (UsageError if
    the host has no such class); `config`: the host config, if read."""
    from slotq.transports.local import LocalTransport

    local = LocalTransport(config=config, away=True)
    if cls not in local.config.classes:
        known = ", ".join(sorted(local.config.classes))
        if not class_given:
            raise UsageError(f"this host has no class {cls!r}, the default: name one of its classes with "
                             f"--class ({known})")
        raise UsageError(f"unknown class {cls!r} (this host knows: {known})")
    return local


def _kept(opts: Namespace, command: list[str]) -> int:
    """A kept run (transports/kept.py): it outlives this call."""
    from slotq.client.caller import run
    from slotq.outcome import Outcome

    json_result = JsonResult(opts.json)
    reports = Reports(opts.junit, None if opts.quiet else _stderr_line)
    try:
        spec, transport = kept_call(opts, command)
    except _ChoiceStopped as stop:
        return _cancelled_while_choosing(opts, _spec(opts, command, opts.report_every), stop)
    except CannotStart as e:
        return e.tell(json_result)
    try:
        result = run(spec, transport, status=reports.say, handle_sigint=True)
        left = result.outcome is Outcome.DETACHED
        if opts.quiet and result.said_when_quiet and not (left and opts.detach):  # (--detach: the id on stdout)
            from slotq.client.result import summary_line

            _stderr_line(summary_line(result))
        reports.done(result)
        json_result.write(result.to_json, open_line=result.open_line)
    finally:
        json_result.discard()
        reports.discard()
    if opts.detach and left:
        os.write(1, f"{result.run_id}\n".encode())
        return 0
    return result.exit_code


def kept_call(opts: Namespace, command: list[str], cwd: str | None = None) -> tuple["RunSpec", "Transport"]:
    """The run and the transport of a kept run (`run --detach` or
    `--attach-for`; the MCP server's run_command), from `slotq run`'s
    options; its work dir `cwd` (default: ours). Raises UsageError for
    options that do not make one."""
    import time

    from slotq.transports.kept import KeptTransport, keep_args, over_ssh

    slurm = use_slurm(opts)
    if opts.detach and opts.attach_for is not None:
        raise UsageError("--detach leaves at once, --attach-for after a while: give one of them")
    if not opts.detach and opts.attach_for is None:
        raise UsageError("--lease and --log-max are for a kept run: add --attach-for D or --detach")
    if not opts.host:
        if opts.sync != "rsync":
            raise UsageError("--sync is for --host")
        from slotq.config import HostConfig

        config = HostConfig.load()
        if slurm:
            from slotq.transports.slurm import SlurmTransport

            SlurmTransport(config).job_for(opts.cls)  # an unmapped class: exit 64 before anything is kept
        elif opts.cls not in config.classes:
            known = ", ".join(sorted(config.classes))
            raise UsageError(f"unknown class {opts.cls!r} (this host knows: {known})")
    spec = _spec(opts, command, opts.report_every)
    spec.cwd = cwd or spec.cwd
    from slotq.host.child import unrunnable

    # Over ssh, the host checks it before its ticket (host/runner.py); in
    # Slurm, a node may have programs this machine has not: its exec says.
    problem = None if opts.host or slurm or opts.prepare else unrunnable(command[0], str(spec.cwd))
    if problem is not None:
        raise CannotStart(spec, problem)
    spec.submitted = time.time()
    hosts: list[str] = []
    if opts.host:
        if opts.sync == "rsync":
            from slotq.transports.ssh import check_work_tree

            check_work_tree(str(spec.cwd))
        hosts = _chosen_hosts(opts)
    reach = None
    if len(hosts) > 1:  # its process here holds a reservation on each (client/standin.py)
        from slotq.transports.kept import Reach

        reach = Reach(hosts, opts.ssh_config, list(opts.ssh_option or []), opts.remote_slotq, opts.sync)
    terms = keep_args(opts.lease, opts.log_max, opts.idle, os.path.realpath(opts.credit_dir or str(spec.cwd)),
                      opts.attach_for, opts.detach, slurm_options=list(opts.slurm_option or []) if slurm else None,
                      hosts=reach)
    transport: Transport = KeptTransport(terms, send_request=True)
    if len(hosts) == 1:
        transport = over_ssh(ssh_transport(opts, hosts[0], sync=opts.sync), terms)
    return spec, transport


def check_new_run_id(run_id: str) -> None:
    """--run-id names a new run: not one live here (its control socket),
    nor one this host's history has. UsageError if it is not."""
    from slotq.host.control import listening_as

    if listening_as(run_id, os.getuid()):
        raise UsageError(f"--run-id {run_id}: a live run has that id (slotq status); give a new one")
    from slotq.cli.cancel import ended_run

    ended = ended_run(run_id)
    if ended is not None:
        raise UsageError(f"--run-id {run_id}: a run with that id has already run here ({ended}); give a new one")


class CannotStart(Exception):
    """The run's command cannot start here (`unrunnable`): its result, said
    as a run that tried would say it (not found: 127, not executable: 126);
    nothing joined the line."""

    def __init__(self, spec: "RunSpec", exec_errno: int) -> None:
        import time

        from slotq.client.result import RunResult
        from slotq.host.child import ChildEnd
        from slotq.outcome import Outcome

        super().__init__(exec_errno)
        end = ChildEnd(None, exec_errno, False)
        self.result = result = RunResult(spec, os.uname().nodename)
        result.outcome, result.command_code, result.not_started = Outcome.FAILED, end.exit_code, True
        result.message = end.describe(spec.argv[0])  # the words of a run that tried (and of slotq task)
        result.phases["submitted"] = result.phases["ended"] = time.time()
        result.queue_s = 0.0

    def tell(self, json_result: JsonResult) -> int:
        """Say it (-q too: nothing of the command's says why), write --json;
        the exit code."""
        from slotq.client.result import summary_line

        _stderr_line(summary_line(self.result))
        try:
            json_result.write(self.result.to_json)
        finally:
            json_result.discard()
        return self.result.exit_code


def _spec(opts: Namespace, command: list[str], report_every: float) -> "RunSpec":
    from slotq.spec import RunSpec

    return RunSpec(command, cls=opts.cls, budget=opts.budget, prepare=opts.prepare,
                   prepare_timeout=opts.prepare_timeout, label=opts.label, report_every=report_every,
                   kill_grace=opts.kill_grace, cwd=current_dir(), max_wait=opts.max_wait, quiet=opts.quiet,
                   run_id=opts.run_id)


class _ChoiceStopped(Exception):
    """A stop signal while the hosts were asked for their status (asked
    from `since`: the run's submission, its wait's start)."""

    def __init__(self, signum: int, since: float) -> None:
        super().__init__(signum)
        self.signum, self.since = signum, since


def _cancelled_while_choosing(opts: Namespace, spec: "RunSpec", stop: _ChoiceStopped) -> int:
    """The run's ending when a stop signal came while several hosts were
    asked which has the shortest wait: cancelled, its line and its result."""
    import time

    from slotq.client.result import RunResult, summary_line
    from slotq.signals import stop_name
    from slotq.outcome import Outcome

    json_result = JsonResult(opts.json)
    result = RunResult(spec, opts.host)
    result.outcome = Outcome.CANCELLED
    result.message = f"cancelled ({stop_name(stop.signum)}) while choosing among hosts {opts.host}; " \
                     "nothing ran"
    result.phases["submitted"], result.phases["ended"] = stop.since, time.time()
    _stderr_line(summary_line(result))
    try:
        json_result.write(result.to_json, open_line=result.open_line)
    finally:
        json_result.discard()
    return result.exit_code


def _remote(opts: Namespace) -> "Transport":
    """The transport to --host: one host; several, late-bound over the
    --spread best of them (transports/bound.py), or one chosen now."""
    hosts = _chosen_hosts(opts)
    if len(hosts) == 1:
        return ssh_transport(opts, hosts[0], sync=opts.sync)
    from slotq.transports.bound import LateBound

    return LateBound([ssh_transport(opts, h, sync=opts.sync) for h in hosts])


def _chosen_hosts(opts: Namespace) -> list[str]:
    """The hosts of --host a run takes a place on: the --spread best of
    them (all by default)."""
    hosts = opts.host.split(",")  # names checked as the options were read (args.host_names)
    spread = len(hosts) if opts.spread is None else opts.spread
    return _best_hosts(opts, hosts, spread) if len(hosts) > 1 and spread < len(hosts) else hosts


def _best_hosts(opts: Namespace, hosts: list[str], n: int) -> list[str]:
    """The `n` hosts with the shortest expected wait, asked now (the
    choice said in one line, even with -q)."""
    import time

    from slotq.client.choose import describe_choice, rank_hosts
    from slotq.transports.ssh import SshHost

    def fetch(h: str) -> dict[str, object]:
        return SshHost(h, config=opts.ssh_config, options=opts.ssh_option,
                       remote_slotq=opts.remote_slotq).status_snapshot()

    from slotq import signals
    from slotq.transports.proc import end_all

    stops: list[int] = []

    def stop(signum: int, frame: object) -> None:
        # The hosts' ssh end now; their threads return, and the run is
        # cancelled once they have (not from inside a thread's wait).
        stops.append(signum)
        end_all()

    since = time.time()
    if signals.early:  # a stop signal while slotq started: no host is asked
        raise _ChoiceStopped(signals.early[0], since)
    held = signals.catch_stops(stop)
    try:
        ranked = rank_hosts(hosts, opts.cls, fetch)
    finally:
        for sig, handler in held.items():
            signals.signal(sig, handler)  # type: ignore[arg-type]
    if stops:
        raise _ChoiceStopped(stops[0], since)
    _stderr_line(describe_choice(ranked, n))  # the choice is always said, even with -q
    return [host for _, host, _ in ranked[:n]]


def _stderr_line(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


def _terminal() -> bool:
    """stderr is a terminal that can redraw a line (not TERM=dumb)."""
    try:
        return os.isatty(2) and os.environ.get("TERM", "") not in ("", "dumb")
    except OSError:
        return False


class LiveLine:
    """One status line on a terminal, redrawn in place (carriage return and
    erase-line, no colour), cut to the terminal's width; any other line
    first erases it."""

    def __init__(self) -> None:
        self.shown = False

    def update(self, text: str) -> None:
        try:
            width = os.get_terminal_size(2).columns or 80  # 0: a terminal that does not say
        except OSError:
            width = 80
        if len(text) >= width or not text.isascii():
            from slotq.cli.status import fit  # (on a terminal only: never a CI run's cost)

            text = fit(text, width)
        self._write("\r\x1b[2K" + text)
        self.shown = True

    def say(self, line: str) -> None:
        self._write(("\r\x1b[2K" if self.shown else "") + line + "\n")
        self.shown = False

    @staticmethod
    def _write(text: str) -> None:
        try:
            os.write(2, text.encode())
        except OSError:
            pass
