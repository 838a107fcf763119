"""What to run and how: the request a client hands to a host runner."""

from __future__ import annotations

import os

from .durations import check_seconds
from .records import valid_text

# How often a waiting run reports its place, holders and load (the mission:
# every 30 s); `--report-every`'s default, and a request's that names none.
REPORT_EVERY = 30.0
MAX_TEXT = {"prepare": 65536, "label": 1000}  # characters, as a host accepts them in a request


def new_run_id() -> str:
    return os.urandom(6).hex()


def is_run_id(text: str) -> bool:
    """What a run id may be: 1..64 ASCII letters and digits (a request's
    `run_id`, `slotq cancel RUN_ID`, `slotq host run --run-id`)."""
    return text.isascii() and text.isalnum() and len(text) <= 64


class RunSpec:
    """One run's request.

    argv: the command, exactly as given (never through a shell).
    cls: run class (mapped to a pool by the host config).
    budget: seconds the command may run once started; None = host default.
    prepare: shell command run after the slot is leased, before the command.
    prepare_timeout: its own limit; None = host default.
    kill_grace: TERM -> KILL grace when stopping; None = host default.
    report_every: seconds between queue status events.
    max_wait: give up after this long in line (`not_admitted`); None = wait.
    quiet: the caller shows no reports (-q): after the first, which tells
      it the run waits, only the head of the line reports (its reports
      end orphaned holders); the caller keeps its wait record alive itself.
    """

    __slots__ = ("argv", "cls", "budget", "prepare", "prepare_timeout", "label",
                 "report_every", "kill_grace", "cwd", "env", "run_id", "work_id", "max_wait", "quiet", "submitted",
                 "kept", "bind", "protocol")

    # What travels to a remote runner (`slotq host run --request-stdin`).
    _REQUEST = ("argv", "cls", "budget", "prepare", "prepare_timeout", "label", "report_every",
                "kill_grace", "run_id", "work_id", "cwd", "max_wait", "quiet", "submitted", "bind", "kept",
                "protocol")
    # Sent only when set: a host of an older slotq refuses a field it does not know.
    _OPTIONAL = ("submitted", "bind", "kept", "protocol")

    def __init__(
        self,
        argv: list[str],
        *,
        cls: str = "shared",
        budget: float | None = None,
        prepare: str | None = None,
        prepare_timeout: float | None = None,
        label: str | None = None,
        report_every: float = REPORT_EVERY,
        kill_grace: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        run_id: str | None = None,
        work_id: str | None = None,
        max_wait: float | None = None,
        quiet: bool = False,
        submitted: float | None = None,
    ) -> None:
        self.argv = list(argv)
        self.cls = cls
        self.budget = budget
        self.prepare = prepare
        self.prepare_timeout = prepare_timeout
        self.label = valid_text(label or _default_label(argv))  # argv need not be UTF-8; the label goes to SQLite
        self.report_every = report_every
        self.kill_grace = kill_grace
        self.cwd, self.env = cwd, env
        self.run_id = run_id or new_run_id()
        self.work_id = work_id  # a synced work dir on a remote host (instead of cwd)
        self.max_wait = max_wait
        self.quiet = quiet
        self.submitted = submitted  # when the caller submitted it (its clock): see submitted_on
        self.kept: float | None = None  # a kept run's lease (client/standin.py), for status and the history
        # The stream protocol the client chose from the host's handshake
        # (transports/ssh.py); None: the previous release's, protocol.BASE.
        self.protocol: int | None = None
        self.bind: list[str] | None = None  # late-bound (transports/bound.py): the other hosts it waits on

    def submitted_on(self, now: float) -> float:
        """When the run was submitted, on a host's clock reading `now`: the
        caller's time, sent with the request -- before its transfer, or its
        wait in Slurm's line -- where it is plausible: not after `now` (a
        caller's clock ahead by a moment) nor more than MAX_IN_FLIGHT before
        it (a clock that is wrong); else `now`. The record's `submitted`
        phase, and so its `waited_s`, on every path (record.py)."""
        sent = self.submitted
        return min(sent, now) if sent is not None and sent > now - MAX_IN_FLIGHT else now

    def to_request(self, protocol: int | None = None) -> bytes:
        """One JSON line. Arguments are JSON strings: no shell sees them.
        (records.to_json: the `json` module would cost a remote run ~5 ms
        of start-up.) `protocol`: the stream protocol chosen from the
        host's handshake (protocol.choose); named only above the
        previous release's, which its hosts would refuse."""
        from .protocol import BASE
        from .records import to_json

        data = {k: getattr(self, k) for k in self._REQUEST
                if k not in self._OPTIONAL or getattr(self, k) is not None}
        if protocol is not None and protocol > BASE:
            data["protocol"] = protocol
        return to_json(data).encode() + b"\n"

    @classmethod
    def from_request(cls, line: bytes) -> "RunSpec":
        """Parse `to_request`'s line; ValueError naming the field if it is
        not one: every field's type and range is checked (a host takes
        requests from any caller that can reach it)."""
        from .records import from_json

        if len(line) > MAX_REQUEST:
            raise ValueError(f"the request is longer than {MAX_REQUEST} bytes")
        try:
            data = from_json(line.decode("utf-8"), 4)
        except UnicodeDecodeError:
            raise ValueError("the request is not UTF-8") from None
        if not isinstance(data, dict):
            raise ValueError("a run request is a JSON object")
        unknown = set(data) - set(cls._REQUEST)
        if unknown:
            raise ValueError(f"unknown request field(s) {sorted(unknown)[:5]}")
        argv = data.pop("argv", None)
        if not isinstance(argv, list) or not argv or len(argv) > 100_000 or argv[0] == "" \
                or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise ValueError("argv must be a non-empty list of strings without NUL bytes")
        for key in ("budget", "prepare_timeout", "report_every"):
            if data.get(key) is not None:
                data[key] = check_seconds(data[key], key)
        for key in ("kill_grace", "max_wait"):  # 0: no grace; no waiting
            if data.get(key) is not None:
                data[key] = check_seconds(data[key], key, allow_zero=True)
        if data.get("report_every") is not None and data["report_every"] < 0.01:
            raise ValueError("report_every must be at least 0.01 seconds")
        if "report_every" in data and data["report_every"] is None:
            del data["report_every"]
        submitted = data.get("submitted")
        if submitted is not None and (isinstance(submitted, bool) or not isinstance(submitted, (int, float))
                                      or not 1e9 <= submitted < 1e11):
            raise ValueError("submitted must be a time in epoch seconds")
        if not isinstance(data.get("quiet", False), bool):
            raise ValueError("quiet must be true or false")
        cls_name = data.get("cls", "shared")
        if not isinstance(cls_name, str) or not 0 < len(cls_name) <= 64 \
                or not all(c.isalnum() or c in "-_" for c in cls_name):
            raise ValueError("cls must be a class name (letters, digits, - or _)")
        for key, limit in MAX_TEXT.items():
            v = data.get(key)
            if v is not None and (not isinstance(v, str) or len(v) > limit or "\0" in v):
                raise ValueError(f"{key} must be a string of at most {limit} characters without NUL bytes")
        for key, low in (("run_id", 1), ("work_id", 8)):
            v = data.get(key)
            if v is not None and (not isinstance(v, str) or not (v.isascii() and v.isalnum())
                                  or not low <= len(v) <= 64):
                raise ValueError(f"{key} must be {low}..64 letters and digits")
        kept = data.pop("kept", None)  # (a Slurm kept run's: its node's runner marks its history line)
        if kept is not None:
            kept = check_seconds(kept, "kept")
        bind = data.pop("bind", None)
        if bind is not None and (not isinstance(bind, list) or len(bind) > MAX_BIND or not all(
                isinstance(h, str) and 0 < len(h) <= 255 and h.isprintable() for h in bind)):
            raise ValueError(f"bind must be a list of at most {MAX_BIND} host names")
        cwd = data.get("cwd")
        if cwd is not None:
            if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd or len(cwd) > 4096:
                raise ValueError("cwd must be an absolute path")
            if data.get("work_id") is not None:
                raise ValueError("a request names a work_id or a cwd, not both")
        wanted = data.pop("protocol", None)
        from .protocol import PROTOCOLS, UPGRADE, spoken

        if wanted is not None and (isinstance(wanted, bool) or wanted not in PROTOCOLS):
            from . import __version__
            from .records import printable

            raise ValueError(f"the client asks for stream protocol {printable(wanted, 20)}; this host's slotq "
                             f"{__version__} speaks {spoken()}: {UPGRADE}")
        spec = cls(argv, **data)
        spec.bind, spec.kept, spec.protocol = bind, kept, wanted
        return spec


MAX_REQUEST = 4 * 1024 * 1024
# A run that says it was submitted longer ago than this (a Slurm job may
# pend for days) has a caller whose clock is wrong, not a wait.
MAX_IN_FLIGHT = 30 * 86400.0
MAX_BIND = 64  # hosts a late-bound run waits on besides this one


def _default_label(argv: list[str]) -> str:
    user = os.environ.get("USER") or os.environ.get("LOGNAME")
    if not user:
        import pwd

        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = str(os.getuid())
    cmd = " ".join(argv)
    if len(cmd) > 40:
        cmd = cmd[:37] + "..."
    return f"{user}: {cmd}"
