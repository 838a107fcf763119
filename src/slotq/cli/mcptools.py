"""The MCP server's tools (`slotq mcp`, cli/mcp.py wires them to the SDK):
what each takes and gives (JSON schemas, docs/mcp.md), the checks of
their arguments, and the result an agent reads. Nothing here imports the
`mcp` SDK.

A run is a kept run (docs/agents.md; transports/kept.py): `run_command`
takes its place in line and stays attached for `wait_for` seconds; if the
run has not ended by then, or the client cancels the call, it is left --
outcome `detached`, its place and clocks kept under its lease -- and
`attach_run` comes back to it. Its output, as the server saw it, is kept in
a file of the user's state (`output_file`); a result carries its tail."""

from __future__ import annotations

import os

from .. import record
from ..durations import exact, format_duration, parse_duration
from ..host.kept import LEASE_MIN

WAIT_FOR = 50.0  # seconds a call blocks by default: under the common 60 s tool-call timeout
MAX_WAIT_FOR = 3600.0
TAIL_BYTES = 32 * 1024  # of the output, in a result: its head and tail if longer
HEAD_BYTES = 4 * 1024
PROGRESS_EVERY = 5.0  # a progress notification at least this often (the issue asks for 10 s)
REPORT_EVERY = 5.0  # the host's queue reports for a run of ours
MAX_ARG_TEXT = 4096  # one string argument (a label, a path, an argv word)
MAX_ARGV = 1000


class ToolError(Exception):
    """Bad arguments, or slotq could not do what was asked: the call's
    `isError` result, with this one line."""


class Settings:
    """The server's defaults (flags of `slotq mcp`, else $SLOTQ_MCP_*)."""

    def __init__(self, allowed: list[str], host: str | None = None, cls: str | None = None,
                 budget: float | None = None, lease: float | None = None, wait_for: float = WAIT_FOR) -> None:
        self.allowed = [os.path.realpath(d) for d in allowed]
        self.host = host
        self.cls = cls
        self.budget = budget
        self.lease = lease
        self.wait_for = wait_for


_DURATION = {"description": "seconds (a number) or a duration such as \"90s\", \"10m\", \"1h\"",
             "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "maxLength": 32}]}
_RUN_ID = {"type": "string", "description": "the run id run_command returned", "maxLength": 64}
_HOST = {"type": "string", "description": "the host the run is on, reached with OpenSSH (default: the server's "
                                         "--host, else this machine)", "maxLength": 255}
_WAIT_FOR = {"type": "number", "minimum": 0, "maximum": MAX_WAIT_FOR,
             "description": "seconds this call may block (default 50); if the run has not ended by then the "
                            "result is `detached`: the run goes on, keeps its place, and attach_run comes back"}

RECORD_SCHEMA: dict[str, object] = {
    "type": "object",
    "description": "the run record of `slotq run --json` (docs/schema/run-record.json), and the output's tail",
    "properties": {
        **record.properties(),
        "output": {
            "type": "object",
            "description": "the output's tail",
            "properties": {
                "text": {"type": "string", "description": "stdout and stderr as they came, the tail (32 KiB; "
                                                          "its first 4 KiB and the rest's tail if longer)"},
                "bytes": {"type": "integer", "description": "all the output seen so far"},
                "cut": {"type": "boolean"},
                "file": {"type": "string", "description": "all of it, in this file"},
            },
        },
    },
    "required": [*record.NAMES, "output"],
}

STATUS_SCHEMA: dict[str, object] = {"type": "object", "description": "`slotq status --json`"}
CANCEL_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"run_id": {"type": "string"}, "cancelled": {"type": "boolean"}, "note": {"type": "string"}},
    "required": ["run_id", "cancelled", "note"],
}


def tools() -> list[dict[str, object]]:
    """name, description, inputSchema, outputSchema of each tool."""
    run_props = {
        "command": {"type": "array", "items": {"type": "string", "maxLength": MAX_ARG_TEXT}, "minItems": 1,
                    "maxItems": MAX_ARGV, "description": "the command line, as a list: [\"pytest\", \"-q\"]"},
        "workdir": {"type": "string", "maxLength": MAX_ARG_TEXT,
                    "description": "the directory to run it in (one of the server's allowed dirs, or below one; "
                                   "default: the first of them)"},
        "budget": dict(_DURATION, description="the command's run time limit, counted from its start, never "
                                              "from the wait (default: the host's, 30m)"),
        "idle": dict(_DURATION, description="stop the command if it prints nothing this long after it started"),
        "class": {"type": "string", "maxLength": 64, "description": "the run's class: shared (default) or landing"},
        "label": {"type": "string", "maxLength": 200, "description": "a name for the run, shown to others in line"},
        "host": _HOST,
        "slurm": {"type": "boolean", "description": "run it on the Slurm cluster (default: the server's --slurm); "
                                                    "attach_run and cancel_run then find it by its run id alone"},
        "wait_for": _WAIT_FOR,
        "lease": dict(_DURATION, description="how long the run waits for an attach_run once nobody is attached "
                                             "(default 15m); then it is withdrawn or stopped"),
        "cancel_on_disconnect": {"type": "boolean", "description": "if this call is cancelled or the client goes, "
                                                                   "give the run up (default: keep it)"},
    }
    attach_props = {"run_id": _RUN_ID, "wait_for": _WAIT_FOR, "host": _HOST}
    return [
        {"name": "run_command",
         "description": "Run a verification command (tests, a type check) on the shared test machine when a slot "
                        "is free. The wait in line never counts against the command's budget. Blocks at most "
                        "wait_for seconds (progress notifications meanwhile); a run not finished by then is "
                        "`detached`, keeps its place, and attach_run comes back to it.",
         "inputSchema": {"type": "object", "properties": run_props, "required": ["command"],
                         "additionalProperties": False},
         "outputSchema": RECORD_SCHEMA},
        {"name": "attach_run",
         "description": "Come back to a run: wait at most wait_for seconds for its end; its result (or "
                        "`detached` again) and its new output.",
         "inputSchema": {"type": "object", "properties": attach_props, "required": ["run_id"],
                         "additionalProperties": False},
         "outputSchema": RECORD_SCHEMA},
        {"name": "run_result",
         "description": "A run's result now, without waiting: `detached` with its phase if it has not ended.",
         "inputSchema": {"type": "object", "properties": {"run_id": _RUN_ID, "host": _HOST}, "required": ["run_id"],
                         "additionalProperties": False},
         "outputSchema": RECORD_SCHEMA},
        {"name": "cancel_run",
         "description": "Give a run up: withdrawn if it waits, stopped if it runs.",
         "inputSchema": {"type": "object", "properties": {"run_id": _RUN_ID, "host": _HOST}, "required": ["run_id"],
                         "additionalProperties": False},
         "outputSchema": CANCEL_SCHEMA},
        {"name": "queue_status",
         "description": "The host's pools: who holds each slot and for how long, who waits, and your runs' places.",
         "inputSchema": {"type": "object", "properties": {"host": _HOST}, "additionalProperties": False},
         "outputSchema": STATUS_SCHEMA},
    ]


# ------------------------------------------------------------------ arguments

def check_known(name: str, args: object) -> dict[str, object]:
    """The arguments of tool `name`: an object, with no property its schema
    does not name."""
    schema = next((t for t in tools() if t["name"] == name), None)
    if schema is None:
        raise ToolError(f"unknown tool {name!r} (this server has: {', '.join(str(t['name']) for t in tools())})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ToolError(f"{name}: the arguments must be an object")
    props = schema["inputSchema"]["properties"]  # type: ignore[index]
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise ToolError(f"{name}: unknown argument {unknown[0]!r} (it takes: {', '.join(props)})")
    for key in schema["inputSchema"].get("required", []):  # type: ignore[attr-defined]
        if key not in args:
            raise ToolError(f"{name}: {key!r} is required")
    return args


def text_arg(args: dict[str, object], key: str, limit: int = MAX_ARG_TEXT) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > limit or "\0" in value:
        raise ToolError(f"{key!r} must be a non-empty string of at most {limit} characters")
    return value


def duration_arg(args: dict[str, object], key: str, default: float | None = None) -> float | None:
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ToolError(f"{key!r} must be seconds or a duration such as \"10m\", got {value!r}")
    try:
        seconds = parse_duration(exact(value) if not isinstance(value, str) else value, what=key)
    except ValueError as e:
        raise ToolError(str(e).splitlines()[0]) from None
    if seconds <= 0:
        raise ToolError(f"{key!r} must be more than 0 seconds")
    if key == "lease" and seconds < LEASE_MIN:
        raise ToolError(f"'lease' must be at least {LEASE_MIN:.0f} second (a lease that lapses as the call "
                        "leaves ends the run with it)")
    return seconds


def wait_for_arg(args: dict[str, object], settings: Settings) -> float:
    value = args.get("wait_for", settings.wait_for)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_WAIT_FOR:
        raise ToolError(f"'wait_for' must be a number of seconds from 0 to {MAX_WAIT_FOR:g}, got {value!r}")
    return float(value)


def workdir_arg(args: dict[str, object], settings: Settings) -> str:
    """The run's work dir: an existing directory at or below one the server
    allows (symlinks resolved first)."""
    given = text_arg(args, "workdir")
    if given is None:
        return settings.allowed[0]
    if not os.path.isabs(given):
        given = os.path.join(settings.allowed[0], given)
    real = os.path.realpath(given)
    if not any(real == d or real.startswith(d.rstrip("/") + "/") for d in settings.allowed):
        raise ToolError(f"workdir {given!r} is outside the directories this server may run in "
                        f"({', '.join(settings.allowed)}; see slotq mcp --allow-dir)")
    if not os.path.isdir(real):
        raise ToolError(f"workdir {given!r} is not a directory")
    return real


def command_arg(args: dict[str, object]) -> list[str]:
    argv = args.get("command")
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV or not all(
            isinstance(a, str) and len(a) <= MAX_ARG_TEXT and "\0" not in a for a in argv) or not argv[0]:
        raise ToolError("'command' must be a non-empty list of strings (the command line: [\"pytest\", \"-q\"])")
    return list(argv)


def run_argv(args: dict[str, object], settings: Settings, wait_for: float) -> list[str]:
    """`slotq run`'s options for a run_command call (its command after
    `--`): the CLI's own checks then apply to what this module does not
    check itself."""
    out = ["-q", "--attach-for", exact(wait_for)]
    budget = duration_arg(args, "budget", settings.budget)
    idle = duration_arg(args, "idle")
    lease = duration_arg(args, "lease", settings.lease)
    cls = text_arg(args, "class", 64) or settings.cls
    label = text_arg(args, "label", 200)
    slurm = args.get("slurm")
    if slurm not in (None, True, False):
        raise ToolError("'slurm' must be true or false")
    host = text_arg(args, "host", 255)
    if slurm and host is not None:
        raise ToolError("'slurm' and 'host' name two different places: give one")
    host = None if slurm else host or settings.host
    for flag, value in (("--budget", budget), ("--idle", idle), ("--lease", lease)):
        if value is not None:
            out += [flag, exact(value)]
    for flag, text in (("--class", cls), ("--label", label), ("--host", host)):
        if text is not None:
            out += [flag, text]
    if args.get("cancel_on_disconnect") not in (None, True, False):
        raise ToolError("'cancel_on_disconnect' must be true or false")
    return [*out, *(["--slurm"] if slurm else []), "--report-every", exact(REPORT_EVERY), "--",
            *command_arg(args)]


def run_id_arg(args: dict[str, object]) -> str:
    from ..spec import is_run_id

    run_id = args.get("run_id")
    if not isinstance(run_id, str) or not is_run_id(run_id):
        raise ToolError(f"'run_id' must be a run id as run_command returned it, got {run_id!r}")
    return run_id


# ------------------------------------------------------------------ results

def output_dir() -> str:
    """Where the server keeps each run's output as it saw it: beside the
    user's wait ledger (never in the host's shared state)."""
    from ..config import ledger_path

    return os.path.join(os.path.dirname(ledger_path()), "mcp")


def output_file(run_id: str) -> str:
    return os.path.join(output_dir(), f"{run_id}.out")


MAX_OUTPUT = 64 << 20  # a run's output file, at most: as a kept run's log (host/kept.py)
KEEP_HEAD = 1 << 20  # ... past it, its first MiB stays, and its newest MiB, the middle goes


class Output:
    """A run's output as the server sees it, written to its file (made
    private to the user) and bounded at `cap` bytes: past it, the middle
    goes -- the first KEEP_HEAD bytes and the newest KEEP_HEAD stay, with a
    line saying how much went -- as a kept run's log keeps its head and
    tail. `fd`: where the run writes (a pipe; a thread writes the file).
    `close()` once the run's call returned: the file is whole then."""

    def __init__(self, run_id: str, cap: int = MAX_OUTPUT) -> None:
        import threading

        from ..statefile import make_private_dirs

        make_private_dirs(output_dir())
        self.cap = max(cap, 4 * KEEP_HEAD)
        self.file = os.open(output_file(run_id), os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                            0o600)
        self.dropped = 0
        self._r, self.fd = os.pipe2(os.O_CLOEXEC)
        from ..signals import start_thread

        self._thread = threading.Thread(target=self._copy, name="slotq-mcp-output", daemon=True)
        start_thread(self._thread.start)

    def _copy(self) -> None:
        while True:
            try:
                data = os.read(self._r, 1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            try:
                if os.fstat(self.file).st_size + len(data) > self.cap:
                    self._shrink()
                os.write(self.file, data)
            except OSError:
                pass  # a full disk: the run goes on, its output here stops
        os.close(self._r)

    def _shrink(self) -> None:
        size = os.fstat(self.file).st_size
        tail = os.pread(self.file, KEEP_HEAD, max(KEEP_HEAD, size - KEEP_HEAD))
        self.dropped += size - KEEP_HEAD - len(tail)
        os.ftruncate(self.file, KEEP_HEAD)
        os.write(self.file, f"\n[... slotq: {self.dropped} bytes of output dropped here: this file keeps the "
                            f"first and the newest {KEEP_HEAD >> 20} MiB ...]\n".encode() + tail)

    def close(self) -> None:
        os.close(self.fd)
        self._thread.join()
        os.close(self.file)


def output_tail(path: str, since: int = 0) -> dict[str, object]:
    """The output from byte `since` on: all of it up to TAIL_BYTES, else
    its first HEAD_BYTES and its last bytes, with a marker."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(since)
            if size - since <= TAIL_BYTES:
                data, cut = f.read(TAIL_BYTES), False
            else:
                head = f.read(HEAD_BYTES)
                f.seek(size - (TAIL_BYTES - HEAD_BYTES))
                tail = f.read()
                dropped = size - since - len(head) - len(tail)
                data, cut = head + f"\n[... {dropped} bytes not shown ...]\n".encode() + tail, True
    except FileNotFoundError:
        size, data, cut = 0, b"", False
    return {"text": data.decode("utf-8", "replace"), "bytes": size, "cut": cut, "file": path}


# What a holder, waiter or history entry of another user says in their own
# words: left out of what a model reads (queue_status).
_THEIR_WORDS = ("label", "lock_holders", "message", "also_waiting_on")


def status_as_data(data: object) -> object:
    """`slotq status --json` (one host's, or a list of hosts') for a model
    to read: other users' runs keep their user, place, times and outcome,
    and lose what those users wrote -- labels, process names, messages --
    as do warnings that quote them: other people's text is a way into the
    agent's instructions (issue 65), and is data, never instructions."""
    from ..procinfo import user_name

    me = user_name(os.getuid())

    def entry(e: object) -> object:
        if not isinstance(e, dict) or e.get("user") == me:
            return e
        return {k: (None if k in _THEIR_WORDS else v) for k, v in e.items()}

    if isinstance(data, list):
        return [status_as_data(d) for d in data]
    if not isinstance(data, dict):
        return data
    out = dict(data)
    pools = out.get("pools")
    if isinstance(pools, list):
        out["pools"] = [dict(p, slots=[entry(s) for s in p.get("slots") or []],
                             waiting=[entry(w) for w in p.get("waiting") or []])
                        if isinstance(p, dict) else p for p in pools]
    history, warnings = out.get("history"), out.get("warnings")
    if isinstance(history, list):
        out["history"] = [entry(h) for h in history]
    if isinstance(warnings, list):
        out["warnings"] = [f"{len(warnings)} warning(s): see `slotq status` (not shown here: they may quote "
                           "other users' words)"] if warnings else []
    return out


def sentence(record: dict[str, object]) -> str:
    """Whose problem the ending is, in one sentence an agent can act on."""
    outcome, code = str(record.get("outcome")), record.get("command_exit_code")
    message = str(record.get("message") or "")
    budget = record.get("budget")
    if outcome == "passed":
        return "the command passed (exit 0)"
    if outcome == "failed":
        return f"the command failed (exit {code}): a result of your change or your command, not of the queue"
    if outcome == "exec_timeout":
        over = f" {format_duration(float(budget))}" if isinstance(budget, (int, float)) else ""
        return f"your command ran past its{over} budget and was stopped (the wait in line did not count)"
    if outcome == "idle_timeout":
        return "your command printed nothing for too long and was stopped (--idle)"
    if outcome == "prepare_failed":
        return f"the run's prepare step failed: {message}"
    if outcome in ("unavailable", "backstop", "not_admitted"):
        return f"the infrastructure gave no slot or no result: not a failure of your change ({message})"
    if outcome == "detached":
        return f"not finished yet: {for_a_model(record)}"
    if outcome == "cancelled":
        return f"the run was cancelled before it finished ({message}): nothing is known about your change"
    if outcome == "caller_gone":
        return f"the run ended because nobody attached to it in time ({message}): not a failure of your change"
    return f"{outcome}: {message}"


def for_a_model(record: dict[str, object]) -> str:
    """A left run's message in the words of this server's tools: where it
    is, and attach_run or cancel_run -- not the CLI's `slotq attach ID`,
    which a model reading a tool's result has no way to run."""
    message = str(record.get("message") or "")
    if "call attach_run" in message:
        return message  # said so already
    where = message.split(": come back with", 1)[0]
    run_id = record.get("run_id")
    return (f"{where}; call attach_run with run_id {run_id!r} to wait for it again (within its lease), or "
            "cancel_run to give it up")


def next_step(record: dict[str, object]) -> str | None:
    if record.get("outcome") != "detached":
        return None
    run_id = record.get("run_id")
    return (f"call attach_run with run_id {run_id!r} to wait for it again (within its lease), or cancel_run to "
            "give it up")
