"""The stream from host runner to client: versioned and framed.

    MAGIC  then frames:  kind (1 byte) | length (4 bytes, big-endian) | payload

kinds: `O` command stdout bytes, `E` command stderr bytes, `V` an event: a
JSON object with at least "event" and "at" (wall-clock seconds on the host),
written and read by records.py (no `json` import: it pulls in `re`, a real
share of a run's start-up). The client trusts nothing it reads: frames and
events have size limits, events a depth limit and a schema (`check_event`:
every known field's type, the outcome one slotq knows), bytes before the
header are capped, and anything else is a ProtocolError -- reported as
`unavailable`, naming the host.
The command's output only ever travels inside O/E frames, so nothing it
prints -- "slot acquired", a fake frame header, binary garbage -- can be read
as an event, and bytes pass through unchanged.

Bytes before MAGIC (a login shell's greeting on a remote host) are skipped
and handed back to the caller as noise.

The other direction, client to runner, is the runner's stdin: text lines
`cancel <reason>`; end-of-file means the caller is gone.
"""

from __future__ import annotations

import os

from .errors import ProtocolError
from .records import from_json, printable, to_json

# Stream protocols: 3, `host run --await-sync`; 4, the request's `quiet`;
# 5, the handshake: `host hello` says the range it speaks (`protocols`)
# and the request names the one the client chose (`protocol`). A runner
# speaks BASE to a client that names none (slotq 0.1.0), which reads only
# BASE: so hosts of this release serve the previous release's clients,
# and its clients read the previous release's hosts (docs/operating.md,
# "Upgrades").
BASE = 4
PROTOCOL_VERSION = 5  # the newest this slotq speaks
PROTOCOLS = range(BASE, PROTOCOL_VERSION + 1)
MAGIC = b"\x00SLOTQ-STREAM %d\n" % BASE  # (streams whose reader is of this release, or of the previous)
MAGIC_PREFIX = b"\x00SLOTQ-STREAM "
STDOUT, STDERR, EVENT = b"O", b"E", b"V"
HEADER_SIZE = 5
MAX_FRAME = 16 * 1024 * 1024  # output chunks are at most 64 KiB; this is a sanity bound
MAX_EVENT = 1024 * 1024
MAX_NOISE = 64 * 1024  # bytes before the header (a login shell's greeting)
EVENT_DEPTH = 6

# Event names.
HELLO = "hello"
QUEUED = "queued"
SLOT = "slot"
PREPARED = "prepared"
STARTED = "started"
EXITED = "exited"
ERROR = "error"
AWAY = "away"  # local runs only: the caller may wait away (host/away.py)
DETACHED = "detached"  # a kept run's attacher leaves, the run goes on (host/kept.py)
OFFERED = "offered"  # a late-bound reservation has a slot: `go` or `pass`? (transports/bound.py)


def write_all(fd: int, data: bytes) -> None:
    """All of `data` to `fd`, waiting while a non-blocking one is full."""
    import select

    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]


UPGRADE = "upgrade the older slotq (pip install -U slotq)"


def spoken() -> str:
    """`protocols 4-5`: what this slotq speaks, for a refusal."""
    return f"stream protocols {PROTOCOLS[0]}-{PROTOCOLS[-1]}"


def _version() -> str:
    from . import __version__

    return __version__


def spoken_by(hello: dict[str, object]) -> tuple[int, int]:
    """(lowest, highest) stream protocol of a host's `slotq host hello`:
    its `protocols`, or -- the previous release's -- its one `protocol`."""
    both = hello.get("protocols")
    if isinstance(both, list) and len(both) == 2 and all(isinstance(p, int) and not isinstance(p, bool)
                                                         for p in both):
        return int(both[0]), int(both[1])
    one = hello.get("protocol")
    return (one, one) if isinstance(one, int) and not isinstance(one, bool) else (0, -1)


def choose(hello: dict[str, object]) -> int | None:
    """The newest stream protocol both speak, from the host's handshake;
    None if none."""
    low, high = spoken_by(hello)
    common = [p for p in PROTOCOLS if low <= p <= high]
    return common[-1] if common else None


def magic(version: int) -> bytes:
    """The stream's header in protocol `version`."""
    return b"\x00SLOTQ-STREAM %d\n" % version


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def event_frame(name: str, at: float, **fields: object) -> bytes:
    body: dict[str, object] = {"event": name, "at": at}
    body.update(fields)
    return frame(EVENT, to_json(body).encode())


_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_INT = (int, type(None))
_OPT_STR = (str, type(None))
# Per event: field -> the types it may have. Required fields are listed in
# _REQUIRED; other known fields are optional; unknown fields are ignored.
_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    HELLO: {"protocol": (int,), "version": (str,), "host": (str,), "pid": (int,), "run_id": (str,),
            "warnings": (list,), "request": (dict,), "lease_s": _NUM, "credit_dir": (str,)},
    QUEUED: {"waited_s": _NUM, "ahead": (int,), "position": (int,), "waiting": (int,), "pool": (str,),
             "holders": (list,), "notes": (list,), "slurm": (dict,), "load1": _NUM, "load5": _NUM, "load15": _NUM,
             "cores": (int,), "eta_s": _NUM, "eta_max_s": _NUM, "eta_how": (str,), "wait_kept": (bool,), "ticket": _OPT_INT,
             "budget": _OPT_NUM, "drained": (dict,)},
    SLOT: {"slot": (str,), "waited_s": _NUM, "budget": _NUM, "ticket": _OPT_INT},
    PREPARED: {"ok": (bool,), "exit_code": _OPT_INT},
    STARTED: {"budget": _NUM},
    EXITED: {"outcome": (str,), "exit_code": _OPT_INT, "signal": _OPT_INT, "message": (str,), "phases": (dict,),
             "not_started": (bool,)},
    ERROR: {"kind": (str,), "message": (str,)},
    AWAY: {"ticket": (str,), "ticket_fd": (int,), "ahead_fd": (int,), "max_wait_s": _NUM, "busy": (list,),
           "slot": (str,)},
    DETACHED: {"run_id": (str,), "phase": (str,), "position": (int,), "ran_s": _NUM, "lease_s": _NUM},
    OFFERED: {"slot": (str,), "ticket": _OPT_INT},
}
_REQUIRED = {HELLO: ("protocol",), QUEUED: (), SLOT: ("slot",), PREPARED: ("ok",), STARTED: (),
             EXITED: ("outcome",), ERROR: ("message",),
             AWAY: ("ticket", "ticket_fd", "ahead_fd"), DETACHED: ("run_id", "phase"), OFFERED: ("slot",)}


def _finite(x: float) -> bool:
    return x - x == 0  # inf - inf and nan - nan are nan (no `math` import: start-up)


def check_event(ev: object) -> dict[str, object]:
    """`ev` if it is a well-formed event; ProtocolError naming what is wrong."""
    if not isinstance(ev, dict):
        raise ProtocolError("malformed event from the host runner (not an object)")
    name = ev.get("event")
    if name not in _FIELDS:
        raise ProtocolError(f"unknown event {str(name)[:40]!r} from the host runner")
    at = ev.get("at")
    if not isinstance(at, _NUM) or isinstance(at, bool) or not _finite(at):
        raise ProtocolError(f"malformed {name} event from the host runner (no time)")
    fields = _FIELDS[name]
    for key in _REQUIRED[name]:
        if key not in ev:
            raise ProtocolError(f"malformed {name} event from the host runner (no {key})")
    for key, types in fields.items():
        if key not in ev:
            continue
        value = ev[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types) or \
                (isinstance(value, float) and not _finite(value)):
            raise ProtocolError(f"malformed {name} event from the host runner ({key} is {type(value).__name__})")
    if name == EXITED:
        from .outcome import Outcome

        try:
            Outcome(str(ev["outcome"]))
        except ValueError:
            raise ProtocolError(f"the host runner reported an outcome this slotq does not know: "
                                f"{str(ev['outcome'])[:40]!r}") from None
        phases: dict[str, object] = ev.get("phases") or {}
        if not all(isinstance(v, _OPT_NUM) and not isinstance(v, bool) for v in phases.values()):
            raise ProtocolError("malformed exited event from the host runner (phases)")
    return ev


class Decoder:
    """Incremental reader: `feed(bytes)` returns complete frames as
    (kind, payload) pairs, events decoded to dicts."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._synced = False
        self.protocol = BASE  # the stream's, once its header is read
        self.noise = bytearray()  # bytes seen before MAGIC

    def feed(self, data: bytes) -> list[tuple[bytes, bytes | dict[str, object]]]:
        self._buf += data
        out: list[tuple[bytes, bytes | dict[str, object]]] = []
        if not self._synced and not self._sync():
            return out
        buf = self._buf
        pos = 0
        while len(buf) - pos >= HEADER_SIZE:
            kind = bytes(buf[pos : pos + 1])
            length = int.from_bytes(buf[pos + 1 : pos + HEADER_SIZE], "big")
            if kind not in (STDOUT, STDERR, EVENT) or length > MAX_FRAME or (kind == EVENT and length > MAX_EVENT):
                raise ProtocolError(f"corrupt frame from the host runner (kind {kind!r}, length {length})")
            if len(buf) - pos - HEADER_SIZE < length:
                break
            start = pos + HEADER_SIZE
            payload = bytes(buf[start : start + length])
            pos = start + length
            if kind == EVENT:
                try:
                    ev = from_json(payload.decode("utf-8"), EVENT_DEPTH)
                except (ValueError, UnicodeDecodeError):
                    raise ProtocolError("undecodable event from the host runner") from None
                out.append((kind, check_event(ev)))
            else:
                out.append((kind, payload))
        del buf[:pos]
        return out

    def _sync(self) -> bool:
        i = self._buf.find(MAGIC_PREFIX)
        if i < 0:
            # Keep a tail that could be the start of MAGIC.
            keep = len(MAGIC_PREFIX) - 1
            if len(self._buf) > keep:
                self.noise += self._buf[:-keep]
                del self._buf[:-keep]
            self._check_noise()
            return False
        nl = self._buf.find(b"\n", i)
        if nl < 0:
            if len(self._buf) - i > 64:
                raise ProtocolError("corrupt stream header from the host runner")
            return False
        version = bytes(self._buf[i + len(MAGIC_PREFIX) : nl])
        if not (version.isdigit() and len(version) <= 4 and int(version) in PROTOCOLS):
            raise ProtocolError(
                f"the host runner speaks stream protocol {printable(version.decode(errors='replace'), 20)}, "
                f"this slotq {_version()} speaks {spoken()}: {UPGRADE}"
            )
        self.protocol = int(version)
        self.noise += self._buf[:i]
        self._check_noise()
        del self._buf[: nl + 1]
        self._synced = True
        return True

    def _check_noise(self) -> None:
        if len(self.noise) > MAX_NOISE:
            raise ProtocolError(f"the host sent more than {MAX_NOISE // 1024} KiB before slotq's stream "
                                "(a login script printing? slotq not running?)")

    @property
    def pending(self) -> int:
        return len(self._buf)
