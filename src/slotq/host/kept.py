"""A kept run's directory on the host: its log, its lease, its attachers.

A run started with `--detach` or `--attach-for` outlives the call that made
it (docs/agents.md): its runner is a process of its own (`slotq host keep`)
and writes its stream -- the same framed stream a caller reads, protocol.py
-- to a log that any number of attachers (`slotq host attach`) follow.

    <user's slotq state>/kept/<run id>/     mode 0700, the run's user's alone
        request      the run's request (RunSpec.to_request) and the keep's terms
        alive        flock'ed by the run's process for its whole life
        attached     flock'ed (shared) by each attacher while it is attached
        lease        its mtime: when the last attacher left (the lease runs from it)
        read         the stream position the last attacher read up to
        seg.<pos>    the stream in segments, named by their first byte's position

The log is bounded (`max_bytes`): once it grows past the bound, whole
segments are dropped from its middle -- never the first half (the head),
never the newest, never one holding an event other than a `queued` report
(so the stream read back always has its hello, slot, started and exited).
A reader finds the gap between two segments and says so in the command's
stderr, where it was.

Everything here is the run's user's own, in a directory nobody else can
open: nothing another user writes is read.
"""

from __future__ import annotations

import fcntl
import os
import time

from .. import protocol
from ..records import from_json, to_json

KEPT_MAX_BYTES = 64 << 20  # a kept run's log, default (--log-max)
LEASE_S = 15 * 60.0  # how long a kept run waits for someone to come back (--lease)
# ... at the least: a lease that lapses as the call leaves ends the run with
# it -- a plain run (`--no-attach`), not a kept one; a second is a harness's
# moment between two calls.
LEASE_MIN = 1.0
MAX_REQUEST_FILE = 4 << 20
_HEADER = protocol.HEADER_SIZE


class KeptError(Exception):
    """No such kept run of ours, or its directory is not what it should be."""


def kept_root() -> str:
    from ..config import ledger_path

    return os.path.join(os.path.dirname(ledger_path()), "kept")


def run_dir(run_id: str) -> str:
    return os.path.join(kept_root(), run_id)


def open_run_dir(run_id: str) -> str:
    """The directory of our kept run `run_id`; KeptError if there is none
    (another user's runs are in their own state, never found here)."""
    import stat

    path = run_dir(run_id)
    try:
        st = os.lstat(path)
    except OSError:
        raise KeptError(f"no kept run {run_id} of yours on this host") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise KeptError(f"{path} is not a private directory of yours: refused")
    return path


def make_run_dir(run_id: str) -> str:
    from ..statefile import make_private_dirs

    make_private_dirs(kept_root())
    path = run_dir(run_id)
    os.mkdir(path, 0o700)  # FileExistsError: a run id is never reused
    return path


def write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_request(path: str) -> dict[str, object]:
    """The run's request and terms, as `host keep` wrote them."""
    with open(os.path.join(path, "request"), "rb") as f:
        data = f.read(MAX_REQUEST_FILE + 1)
    if len(data) > MAX_REQUEST_FILE:
        raise KeptError(f"{path}/request is larger than {MAX_REQUEST_FILE} bytes")
    rec = from_json(data.decode("utf-8", "replace"), 6)
    if not isinstance(rec, dict):
        raise KeptError(f"{path}/request is not a JSON object")
    return rec


def in_slurm(run_id: str) -> bool:
    """Our kept run `run_id` is a Slurm job (kept with `--slurm`), live."""
    return slurm_lease(run_id) is not None


def slurm_lease(run_id: str) -> float | None:
    """The lease of our live kept run `run_id` if it is a Slurm job (kept
    with `--slurm`; its process is on this machine); else None."""
    from ..errors import SlotqError

    try:
        path = open_run_dir(run_id)
        terms = read_request(path)
        if not isinstance(terms.get("slurm"), list) or not held(os.path.join(path, "alive")):
            return None
    except (KeptError, OSError, ValueError, SlotqError):  # (SlotqError: a $SLOTQ_LEDGER that is relative)
        return None
    lease = terms.get("lease_s")
    return float(lease) if isinstance(lease, (int, float)) and not isinstance(lease, bool) else LEASE_S


def late_bound_hosts(run_id: str) -> dict[str, object] | None:
    """How to reach the hosts of our live kept run `run_id` if it is
    late-bound over several (kept with `--hosts`; its process is on this
    machine): transports.kept.Reach's fields; else None."""
    from ..errors import SlotqError

    try:
        path = open_run_dir(run_id)
        terms = read_request(path)
        if not isinstance(terms.get("hosts"), dict) or not held(os.path.join(path, "alive")):
            return None
    except (KeptError, OSError, ValueError, SlotqError):
        return None
    return terms["hosts"]  # type: ignore[return-value]


def lock_file(path: str, how: int) -> int | None:
    """`path` (made if missing) flock'ed `how` without waiting: its fd, or
    None if someone holds it the other way."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def held(path: str) -> bool:
    """Someone holds a lock on `path` (the run's process: `alive`; an
    attacher: `attached`). Looked at read-only: closing it wakes no
    attacher's watch."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def renew(path: str) -> None:
    """The lease starts again from now."""
    try:
        os.utime(os.path.join(path, "lease"))
    except FileNotFoundError:
        write_file(os.path.join(path, "lease"), b"")


def lease_ends(path: str, lease_s: float) -> float | None:
    """When the lease lapses (wall clock) if nobody comes back; None while
    someone is attached."""
    if held(os.path.join(path, "attached")):
        return None
    try:
        left = os.stat(os.path.join(path, "lease")).st_mtime
    except OSError:
        left = 0.0
    return left + lease_s


def segments(path: str) -> list[tuple[int, str]]:
    """(start position, file) of each segment, in order."""
    out = []
    for name in os.listdir(path):
        if name.startswith("seg.") and name[4:].isdigit():
            out.append((int(name[4:]), os.path.join(path, name)))
    return sorted(out)


def split_frames(buf: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
    """Whole frames at the start of `buf` as (kind, payload), and how many
    bytes they took (a frame cut short is left for later)."""
    out, pos = [], 0
    while len(buf) - pos >= _HEADER:
        size = int.from_bytes(buf[pos + 1:pos + _HEADER], "big")
        if size > protocol.MAX_FRAME:
            raise KeptError(f"a frame of {size} bytes in the run's log: it is corrupt")
        if len(buf) - pos - _HEADER < size:
            break
        out.append((buf[pos:pos + 1], buf[pos + _HEADER:pos + _HEADER + size]))
        pos += _HEADER + size
    return out, pos


def event_name(payload: bytes) -> str:
    ev = from_json(payload.decode("utf-8", "replace"), protocol.EVENT_DEPTH)
    return str(ev.get("event")) if isinstance(ev, dict) else ""


class KeptLog:
    """The writer: the run's stream, appended frame by frame, bounded."""

    def __init__(self, path: str, max_bytes: int = KEPT_MAX_BYTES, resume: bool = False) -> None:
        """`resume`: the log goes on where it ends (a run back from waiting
        away, client/standin.py); its segments so far are kept."""
        self.path = path
        self.max_bytes = max(max_bytes, 1 << 16)
        self.seg_bytes = max(1 << 14, self.max_bytes // 16)
        self.head = self.max_bytes // 2
        self.pos = 0  # the stream's length so far, dropped parts included
        self.fd = -1
        self.seg_start = 0
        self.on_disk: list[list[int]] = []  # [start, size, keep] of each segment still there
        if resume:
            for start, name in segments(path):
                self.on_disk.append([start, os.stat(name).st_size, 1])
            if self.on_disk:
                self.seg_start, size, _ = self.on_disk[-1]
                self.pos = self.seg_start + size
                self.fd = os.open(os.path.join(path, f"seg.{self.seg_start:016d}"),
                                  os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)

    def write(self, data: bytes, important: bool) -> None:
        """One whole frame (or the stream's header). `important`: it holds
        an event a reader must see (all but `queued`): its segment stays."""
        if self.fd < 0 or self.pos - self.seg_start >= self.seg_bytes:
            self._roll()
        os.write(self.fd, data)
        self.pos += len(data)
        seg = self.on_disk[-1]
        seg[1] += len(data)
        seg[2] = seg[2] or important
        self._trim()

    def _roll(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.seg_start = self.pos
        name = os.path.join(self.path, f"seg.{self.pos:016d}")
        self.fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.on_disk.append([self.pos, 0, 0])

    def _trim(self) -> None:
        total = sum(s[1] for s in self.on_disk)
        for seg in list(self.on_disk[:-1]):
            if total <= self.max_bytes:
                return
            if seg[0] + seg[1] <= self.head or seg[2]:
                continue
            try:
                os.unlink(os.path.join(self.path, f"seg.{seg[0]:016d}"))
            except FileNotFoundError:
                pass
            self.on_disk.remove(seg)
            total -= seg[1]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Reading:
    """What a reader of the log has seen: where the run is, and how far
    into the stream this attacher has read."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.position: int | None = None  # in line, from the last `queued`
        self.queued_at: float | None = None
        self.slot_at: float | None = None
        self.started_at: float | None = None
        self.ended = False  # exited (or an error: the run never queued)
        self.placed = False  # in line, or further: the place is real

    def note(self, payload: bytes) -> str:
        name = event_name(payload)
        self.seen.add(name)
        ev = from_json(payload.decode("utf-8", "replace"), protocol.EVENT_DEPTH)
        at = ev.get("at") if isinstance(ev, dict) else None
        at = float(at) if isinstance(at, (int, float)) else time.time()
        if name == protocol.QUEUED and isinstance(ev, dict):
            pos = ev.get("position")
            self.position = pos if isinstance(pos, int) else self.position
            self.queued_at = self.queued_at or at
        elif name == protocol.SLOT:
            self.slot_at = at
        elif name == protocol.STARTED:
            self.started_at = at
        if name in (protocol.EXITED, protocol.ERROR):
            self.ended = True
        if name in (protocol.QUEUED, protocol.SLOT, protocol.EXITED, protocol.ERROR):
            self.placed = True
        return name

    def detached(self, run_id: str, lease_s: float, now: float) -> bytes:
        """The `detached` event that ends an attacher's stream early."""
        fields: dict[str, object]
        if self.started_at is not None:
            phase, fields = "running", {"ran_s": round(now - self.started_at, 3)}
        elif self.slot_at is not None:
            phase, fields = "starting", {}  # its slot acquired; its --prepare step, if any, or the command's start
        else:
            phase, fields = "waiting", {"position": self.position}
        return protocol.event_frame(protocol.DETACHED, now, run_id=run_id, phase=phase, lease_s=lease_s,
                                    **{k: v for k, v in fields.items() if v is not None})


def dropped_note(gap: int, head: int) -> bytes:
    return protocol.frame(protocol.STDERR, (
        f"\nslotq: {gap} bytes of the run's stream were dropped here (its log keeps the first "
        f"{head >> 20 if head >= 1 << 20 else head} {'MiB' if head >= 1 << 20 else 'bytes'} and the newest)\n"
    ).encode())


def to_json_line(rec: dict[str, object]) -> bytes:
    return to_json(rec).encode() + b"\n"
