"""Command-line parsing for every subcommand: one small parser instead of
argparse, which (with `re`, which it imports) costs a noticeable share of
`slotq run`'s start-up (benchmarks/).

Options: `--name VALUE`, `--name=VALUE`, flags, repeatable options, in any
order. The command starts after `--`, or -- when no `--` is given -- at the
first argument that is not an option; where a `--` is given, a bare word
before it is an error (`--budget 10 minutes -- true` would run `minutes`).
A command of RUN_IDs and the like (`positional`) takes them anywhere among
its options. Every bad argument is a one-line `UsageError` (exit 64,
EX_USAGE) naming the option.
"""

from __future__ import annotations

import os
import sys

from slotq.durations import parse_duration
from slotq.errors import UsageError, shown
from slotq.spec import MAX_TEXT, REPORT_EVERY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from slotq.transports.ssh import SshTransport

FLAG, VALUE, APPEND = "flag", "value", "append"


class Opt:
    """One option: names (`--budget`, `-q`), how it takes values, its help."""

    __slots__ = ("names", "dest", "kind", "metavar", "help", "default", "convert", "choices", "suggest", "required",
                 "needs")

    def __init__(self, *names: str, kind: str = VALUE, dest: str | None = None, metavar: str = "VALUE",
                 help: str = "", default: object = None, convert: Callable[[str], object] | None = None,
                 choices: tuple[str, ...] | None = None, required: bool = False,
                 needs: tuple[str, str] | None = None, suggest: tuple[str, ...] | None = None) -> None:
        """needs: (an option, what this one is to it): given without that
        option, this one is refused, as `--every is how often --watch
        redraws: add --watch`, not silently of no effect. suggest: values
        the shell completion offers (`convert` checks them; `choices` are
        both)."""
        self.names = names
        long = next((n for n in names if n.startswith("--")), names[0])
        self.dest = dest or long.lstrip("-").replace("-", "_")
        self.kind = kind
        self.metavar = metavar
        self.help = help
        self.default = [] if kind == APPEND and default is None else (False if kind == FLAG else default)
        self.convert = convert
        self.choices = choices
        self.suggest = suggest or choices
        self.required = required
        self.needs = needs


class Namespace:
    """Parsed options as attributes."""

    def __init__(self, values: dict[str, object]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:  # for mypy: attributes are dynamic
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__[name] = value


class Parser:
    def __init__(self, prog: str, usage: str, description: str, options: list[Opt], epilog: str = "",
                 command: str = "none", hints: dict[str, str] | None = None) -> None:
        """command: "none" (no trailing command), "optional" or "required"
        (a command line: after `--`, or from the first word that is not an
        option), or "positional" (words among the options: RUN_IDs).
        hints: what to say of an option this command does not take but a
        user may try (another command's)."""
        self.prog = prog
        self.hints = hints or {}
        self.usage = usage
        self.description = description
        self.options = options
        self.epilog = epilog
        self.command = command
        self._by_name = {n: o for o in options for n in o.names}

    def parse(self, args: list[str]) -> tuple[Namespace, list[str]]:
        """(options, command). Prints help and exits 0 on -h/--help."""
        values: dict[str, object] = {o.dest: (list(o.default) if isinstance(o.default, list) else o.default)
                                     for o in self.options}
        seen: set[str] = set()
        command: list[str] = []
        dashdash = "--" in args  # (never an option's value: `--budget -- pytest` is refused below)
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                command += args[i + 1 :]
                break
            if arg in ("-h", "--help"):
                write_out(self.help())
                raise SystemExit(0)
            if not arg.startswith("-") or arg == "-":
                if self.command == "positional":
                    command.append(arg)
                    i += 1
                    continue
                if self.command == "none":
                    raise self.error(f"unexpected argument {arg!r}")
                if dashdash:
                    raise self.error(f"unexpected argument {shown(arg)} before `--`: the command comes after it "
                                     "(an option's value is one word: --budget 10m)")
                command = args[i:]
                break
            name, eq, inline = arg.partition("=")
            opt = self._by_name.get(name)
            if opt is None:
                hint = self.hints.get(name) or did_you_mean(name, self._by_name)
                raise self.error(f"unknown option {cut(name)}{hint}")
            seen.add(opt.dest)
            if opt.kind == FLAG:
                if eq:
                    raise self.error(f"option {name} takes no value")
                values[opt.dest] = True
                i += 1
                continue
            if eq:
                raw = inline
                i += 1
            elif i + 1 < len(args) and args[i + 1] != "--":
                raw = args[i + 1]
                i += 2
            else:  # `--budget -- pytest`: the value was forgotten, `--` is not one (`--label=--` can say it)
                raise self.error(f"option {name} needs a value ({opt.metavar})")
            if opt.choices is not None and raw not in opt.choices:
                raise self.error(f"option {name}: {raw!r} is not one of {', '.join(opt.choices)}")
            try:
                value = opt.convert(raw) if opt.convert else raw
            except ValueError as e:
                raise self.error(f"option {name}: {e}") from None
            if opt.kind == APPEND:
                values[opt.dest].append(value)  # type: ignore[attr-defined]
            else:
                values[opt.dest] = value
        for o in self.options:
            if o.required and o.dest not in seen:
                raise self.error(f"option {o.names[0]} is required")
            if o.needs and o.dest in seen and self._by_name[o.needs[0]].dest not in seen:
                raise self.error(f"{o.names[0]} {o.needs[1]}: add {o.needs[0]}")
        if self.command == "required" and not command:
            raise self.error(f"no command given: write it after `--`, e.g. `{self.prog} -- pytest -q`")
        if self.command == "required" and command[0] == "":
            raise self.error("the command name is empty")
        return Namespace(values), command

    def error(self, message: str) -> UsageError:
        return UsageError(f"{message} (see `{self.prog} --help`)")

    def help(self) -> str:
        import textwrap

        lines = [f"usage: {self.usage}", "", textwrap.fill(self.description, 79), "", "options:"]
        lines.append(f"  {'-h, --help':24} show this help")
        for o in self.options:
            head = ", ".join(o.names) + ("" if o.kind == FLAG else f" {o.metavar}")
            text = o.help + (" (repeatable)" if o.kind == APPEND else "")
            wrapped = textwrap.wrap(text, 79 - 27) or [""]
            if len(head) > 24:
                lines.append(f"  {head}")
                lines += [" " * 27 + w for w in wrapped]
            else:
                lines.append(f"  {head:24} {wrapped[0]}")
                lines += [" " * 27 + w for w in wrapped[1:]]
        if self.epilog:
            lines += ["", self.epilog.rstrip()]
        return "\n".join(lines) + "\n"


def duration(what: str = "", allow_zero: bool = False, minimum: float = 0.0) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = parse_duration(text, allow_zero=allow_zero)
        if value < minimum:
            raise ValueError(f"{text!r} is shorter than the minimum of {minimum:g}s")
        return value

    return parse


def bounded_text(limit: int, blank: str | None = None) -> Callable[[str], str]:
    """Text of at most `limit` characters: what a host accepts in a run
    request (spec.MAX_TEXT), so a run is refused here, whatever the host.
    `blank`: what it names, if blank text is refused (`--prepare "$P"`
    with P unset must not run the command unprepared)."""
    def check(text: str) -> str:
        if len(text) > limit:
            raise ValueError(f"{len(text)} characters, more than the limit of {limit}")
        if blank is not None and not text.strip():
            raise ValueError(f"an empty {blank}")
        return text

    return check


def host_names(text: str) -> str:
    """HOST[,HOST...] as `a,b`: blanks, empty names and repeats dropped, at
    least one left (`--host "$HOST"` with HOST unset must not run here
    instead), none that ssh would read as an option; `@name`: the hosts of
    group `name` in your config ([groups])."""
    hosts: list[str] = []
    for h in (h.strip() for h in text.split(",")):
        if h.startswith("@"):
            hosts += _group(h[1:])
        elif h:
            hosts.append(h)
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        raise ValueError("no host named")
    for h in hosts:
        if h.startswith("-"):
            raise ValueError(f"not a host name: {h!r}")
    return ",".join(hosts)


def _group(name: str) -> list[str]:
    from slotq.config import HostConfig

    config = HostConfig.load()
    if name not in config.groups:
        known = ", ".join("@" + g for g in sorted(config.groups)) or "none"
        where = config.path or "your config ($XDG_CONFIG_HOME/slotq/config.toml)"
        raise ValueError(f"no host group {name!r} in {where} ([groups]; known: {known})")
    return config.groups[name]


def _a_command(text: str) -> str:
    if not text.strip():
        raise ValueError("an empty command")
    return text


def cut(text: str, limit: int = 40) -> str:
    """`text` for a one-line message: printable, at most `limit` characters."""
    from slotq.records import printable

    return printable(text, limit)


# `status --slurm` and `cancel --slurm` look at Slurm; the runs' lines are
# where every run's are.
SLURM_RUNS_HERE = (": a run through Slurm is in the history like any other (its line is written into your state "
                   "dir): leave --slurm out")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean X?)` for the known name closest to a mistyped one,
    or ''. Only on the way to an error: difflib is not loaded otherwise."""
    if len(name) > 64:
        return ""
    known = list(known)
    near = [k for k in known if k.startswith(name) and len(name) > 2]  # `hist`: history
    if len(near) != 1:
        from difflib import get_close_matches

        near = get_close_matches(name, known, n=1, cutoff=0.75)
    return f" (did you mean {near[0]}?)" if near else ""


def current_dir() -> str:
    """os.getcwd(); a usage error if the directory was deleted under us
    (`.` still stats, but names nothing anyone could find again)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError("the current directory no longer exists: cd somewhere that does") from None


def check_dir(option: str, path: str) -> str:
    """`path` if it is a directory; else a usage error naming `option` and
    what is wrong (a work dir whose waits are recorded or credited: one
    named by a typo would never be found again)."""
    if not path:
        raise UsageError(f"{option} needs a directory, not an empty name")
    if not os.path.isabs(path):
        current_dir()
    if not os.path.isdir(path):
        why = "not a directory" if os.path.exists(path) else "no such directory"
        raise UsageError(f"{option} {path}: {why}")
    return path


def window_options() -> list[Opt]:
    """--since/--until: a time window (the last 24 h by default)."""
    return [Opt("--since", metavar="T", default="24h",
                help="window start: a duration ago (2h, 7d), an ISO time (2026-11-30T09:00) or epoch seconds "
                     "(default: 24h)"),
            Opt("--until", metavar="T", help="window end (default: now)")]


def parse_window(opts: Namespace) -> tuple[float, float]:
    """(since, until) as epoch seconds from window_options(); a usage
    error for an unreadable time or an empty window."""
    import time

    from slotq.durations import parse_when

    now = time.time()
    try:
        since = parse_when(opts.since, now, what="--since")
        until = parse_when(opts.until, now, what="--until") if opts.until else now
    except ValueError as e:
        raise UsageError(str(e)) from None
    if until <= since:
        def stamp(t: float) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

        raise UsageError(f"--until is not after --since: the window {stamp(since)} to {stamp(until)} is empty "
                         "(a bare number below 1e9 is seconds ago, from 1e9 on epoch seconds)")
    return since, until


def byte_size(text: str) -> int:
    """`64M`, `512K`, `1G` or a number of bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    digits, unit = (text[:-1], units[text[-1].upper()]) if text[-1:].upper() in units else (text, 1)
    if not digits.isdigit() or not 0 < int(digits) * unit <= 1 << 40:
        raise ValueError(f"{text!r} is not a size (e.g. 64M, 512K, or bytes)")
    return int(digits) * unit


def run_id_and_options(parser: Parser, args: list[str]) -> tuple[str, Namespace]:
    """RUN_ID and options, in any order (a parser of command="positional")."""
    from slotq.spec import is_run_id

    opts, ids = parser.parse(args)
    if len(ids) != 1:
        raise parser.error("name one run id" if not ids else f"unexpected argument {ids[1]!r}")
    if not is_run_id(ids[0]):
        raise parser.error(f"{ids[0]!r} is not a run id (1..64 letters and digits)")
    return ids[0], opts


def positive_int(text: str) -> int:
    """A whole number from 0; one above 10**12 (more than any count slotq
    keeps) means "all" and is read as 10**12."""
    digits = text.strip()
    if len(digits) > 100 and digits.isascii() and digits.isdigit():
        return 10**12  # int() refuses thousands of digits
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"{shown(text)} is not a whole number") from None
    if n < 0:
        raise ValueError(f"{shown(text)} is negative")
    return min(n, 10**12)


RUN_OPTIONS = [
    Opt("--class", dest="cls", metavar="CLASS",  # None: not given, `shared`
        help="run class; the host maps it to a pool (default: shared; landing has its own slot)"),
    Opt("--budget", metavar="D", convert=duration(),
        help="how long the command may run once it has started (default: the host's, 60m); "
             "time spent waiting in line never counts"),
    Opt("--prepare", metavar="CMD", convert=bounded_text(MAX_TEXT["prepare"], blank="command"),
        help="shell command run after the slot is acquired, before the command (its own limit)"),
    Opt("--prepare-timeout", metavar="D", convert=duration(), needs=("--prepare", "is the limit of --prepare"),
        help="limit for --prepare (default: the host's, 10m)"),
    Opt("--kill-grace", metavar="D", convert=duration(allow_zero=True),
        help="TERM -> KILL grace when the command is stopped (default: 10s)"),
    Opt("--label", metavar="TEXT", convert=bounded_text(MAX_TEXT["label"]),
        help="how this run is shown to others (default: user: command)"),
    Opt("--report-every", metavar="D", convert=duration(minimum=0.01), default=REPORT_EVERY,
        help=f"queue status interval while waiting (default: {REPORT_EVERY:g}s)"),
    Opt("--max-wait", metavar="D", convert=duration(allow_zero=True),
        help="give up after D in line: outcome not_admitted (exit 117), never a timeout; 0: never wait, a "
             "free slot or not_admitted at once, as flock -n (default: wait as long as it takes)"),
]


_HOW_TO_REACH = ("--host", "says how to reach --host")  # given alone, the run would be here, not there


def host_options(what: str = "run on HOST", several: str = "several: the one with the shortest expected wait"
                 ) -> list[Opt]:
    """--host and how to reach it; `what` says what this command does with
    HOST, `several` what several hosts mean to it."""
    return [
        Opt("--host", metavar="HOST[,HOST...]", convert=host_names,
            help=f"{what} over ssh (an alias from your ssh config, or user@host); {several}"),
        Opt("--ssh-config", metavar="FILE", default=os.environ.get("SLOTQ_SSH_CONFIG"), needs=_HOW_TO_REACH,
            help="ssh config file (default: $SLOTQ_SSH_CONFIG, else ssh's own)"),
        Opt("--ssh-option", kind=APPEND, metavar="OPT", needs=_HOW_TO_REACH,
            help="extra ssh -o option, e.g. Port=2222"),
        Opt("--remote-slotq", metavar="CMD", default=os.environ.get("SLOTQ_REMOTE_SLOTQ") or "slotq",
            convert=_a_command, needs=_HOW_TO_REACH,
            help="how to run slotq on the host, a shell fragment (default: $SLOTQ_REMOTE_SLOTQ, else slotq)"),
    ]


def _srun_option(text: str) -> str:
    from slotq.config import srun_option_problem

    if not text.startswith("-"):
        raise ValueError(f"{shown(text)} is not an srun option (they start with -; give an option and its value "
                         f"as one word: --slurm-option=--account=ci)")
    why = srun_option_problem(text)
    if why:
        raise ValueError(f"{shown(text)} cannot be used with slotq ({why})")
    return text


def slurm_options() -> list[Opt]:
    return [
        Opt("--slurm", kind=FLAG,
            help="run on the Slurm cluster (default: $SLOTQ_BACKEND=slurm): the class picks the partition "
                 "and QoS ([slurm.classes] in the host config); a pending job is a place in line"),
        Opt("--slurm-option", kind=APPEND, metavar="OPT", convert=_srun_option,
            help="give OPT to Slurm (srun) as it is, e.g. --slurm-option=--cpus-per-task=4 (not those that "
                 "change how the job runs its one task: --ntasks, --output, --input, --label, --job-name...)"),
    ]


def use_slurm(opts: Namespace) -> bool:
    """--slurm, or $SLOTQ_BACKEND=slurm (run, status and cancel alike: who
    runs on Slurm looks there too); one line and exit 64 for a backend slotq
    does not know, or for --slurm with --host."""
    backend = os.environ.get("SLOTQ_BACKEND", "")
    if backend not in ("", "local", "slurm"):
        raise UsageError(f"$SLOTQ_BACKEND={backend!r} is not a backend slotq knows (local, slurm)")
    slurm = bool(opts.slurm) or (backend == "slurm" and not opts.host)
    if opts.slurm and opts.host:
        raise UsageError("--slurm and --host name two different places: choose one")
    if getattr(opts, "slurm_option", None) and not slurm:
        raise UsageError("--slurm-option needs --slurm (or $SLOTQ_BACKEND=slurm)")
    return slurm


def ssh_transport(opts: Namespace, host: str, sync: str = "rsync") -> "SshTransport":
    from slotq.transports.ssh import SshTransport

    return SshTransport(host, config=opts.ssh_config, options=opts.ssh_option,
                        remote_slotq=opts.remote_slotq, sync=sync)


class JsonResult:
    """Where `--json FILE|-` goes. Checked when the options are read, so a
    bad path is a usage error before the run, not a result lost after it.
    A regular file is written whole or not at all: into a temporary file
    beside it (made now, which proves the directory writable), renamed over
    FILE at the end; an existing FILE is untouched until then. A device or
    FIFO (`/dev/stderr`) is opened now and written at the end."""

    def __init__(self, dest: str | None, option: str = "--json") -> None:
        import errno
        import stat

        self.dest = dest
        self.option = option  # named in errors
        self._fd = -1
        self._tmp: str | None = None
        if dest == "":  # `--json "$OUT"` with OUT unset: say so, rather than lose the result
            raise UsageError(f"{option} needs a file name (or - for stdout), not an empty one")
        if dest is None or dest == "-":
            return
        try:
            st: os.stat_result | None = os.stat(dest)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise UsageError(f"cannot write {option} file {dest}: {e.strerror}") from None
        try:
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise UsageError(f"cannot write {option} file {dest}: it is a directory")
            if st is not None and not stat.S_ISREG(st.st_mode):
                if stat.S_ISFIFO(st.st_mode) and st.st_uid != os.getuid():
                    raise UsageError(f"cannot write {option} file {dest}: it is a FIFO of another user's")
                # Never blocking: a FIFO nobody reads would hold the run here,
                # before its signal handlers (ENXIO instead).
                try:
                    self._fd = os.open(dest, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                except OSError as e:
                    if e.errno == errno.ENXIO:
                        raise UsageError(f"cannot write {option} file {dest}: it is a FIFO nobody reads") from None
                    raise
                os.set_blocking(self._fd, True)  # the result is written whole, at the end
                return
            if st is not None and not os.access(dest, os.W_OK):
                raise UsageError(f"cannot write {option} file {dest}: permission denied")
            base = os.path.join(os.path.dirname(os.path.abspath(dest)), "." + os.path.basename(dest))
            self._tmp = f"{base}.{os.getpid()}.{os.urandom(3).hex()}.tmp"
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                               0o666 if st is None else stat.S_IMODE(st.st_mode))
        except OSError as e:
            raise UsageError(f"cannot write {option} file {dest}: {e.strerror}") from None

    def write(self, render: Callable[[bool], str], open_line: bool = False) -> bool:
        """Write `render(one_line)` if --json was given: for stdout (`-`)
        one compact line, the last (`tail -1 | jq` reads it), else indented.
        A callable, so a run without --json never renders (rendering imports
        `json`, which imports `re`: about 6 ms, a third of a run's own cost).
        A result that cannot be written is one line on stderr, and False; no
        partial file is left."""
        if not self.dest:
            return True
        data = (render(self.dest == "-") + "\n").encode()
        if self.dest == "-":
            if open_line:  # the command's output on stdout ended mid-line: the JSON starts on its own
                data = b"\n" + data
            try:
                os.write(1, data)
            except BrokenPipeError:
                pass  # its reader is gone (`| jq` and no jq): quiet, as a pipeline would be
            except OSError as e:
                _warn(f"slotq: could not write the {self.option} result to stdout: {e.strerror}")
                return False
            return True
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            if self._tmp is not None:
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
            if self._tmp is not None:
                os.replace(self._tmp, self.dest)
                self._tmp = None
        except OSError as e:
            _warn(f"slotq: could not write the {self.option} result to {self.dest}: {e.strerror}")
            return False
        finally:
            self.discard()
        return True

    def discard(self) -> None:
        """Drop the temporary file (a run that ended before its result)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass
            self._tmp = None


def reader_exits(unreachable: str, bad: str = "bad arguments") -> str:
    """The exit codes of a command that shows what it reads (status,
    history, report); `unreachable`: what 121 means to it; `bad`: what 64
    means to it."""
    import textwrap

    return textwrap.fill(f"exit codes: 0 shown, 64 {bad}; 73 unusable state directory; 74 the output cannot be "
                         f"written; 78 bad host config; 121 {unreachable}", 79)


def write_out(text: str) -> None:
    """`text` on stdout, now. A reader gone stays BrokenPipeError (quiet);
    any other failure (a full disk) is OutputError (exit 74)."""
    from slotq.errors import OutputError

    OutputError.guard(sys.stdout.write, text)
    OutputError.guard(sys.stdout.flush)


def _warn(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass
