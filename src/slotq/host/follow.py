"""An attacher of a kept run (host/kept.py): its stream, read back from the
run's log and followed while the run goes on, on the attacher's stdout.

The stream is the one `slotq host run` writes, so the client reads it as
it reads any run: every event (its hello carrying the run's request, for
the result record), and the command's output from where the last attacher
left off (or from the start). It ends with the run's `exited`; or with a
`detached` event when the attacher's time is up (`until`), once the run
has its place (`until_placed`: `run --detach`), or when the client closes
our stdin (it was stopped: the run goes on).

While attached, the attacher holds `attached` (shared): the lease does not
run. When it leaves, the lease starts again from then.
"""

from __future__ import annotations

import fcntl
import os
import select
import time

from .. import protocol
from ..records import from_json, to_json
from . import kept

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .inotify import Watcher

POLL_S = 0.5  # without inotify: how often the log is looked at
# An attacher renews the lease this often while attached: killed (a
# harness's SIGKILL), it has said when it was last there.
RENEW_S = 5.0


class Follower:
    def __init__(self, path: str, out_fd: int, in_fd: int, *, from_start: bool = False) -> None:
        self.path = path
        self.out_fd = out_fd
        self.in_fd = in_fd
        self.terms = kept.read_request(path)
        self.run_id = os.path.basename(path)
        lease = self.terms.get("lease_s")
        self.lease_s = float(lease) if isinstance(lease, (int, float)) else kept.LEASE_S
        self.start_pos = 0 if from_start else _read_pos(path)
        self.pos = 0  # the next stream byte to read
        self.reading = kept.Reading()
        self.read_upto = self.start_pos

    def follow(self, until: float | None = None, until_placed: bool = False) -> bool:
        """Send the stream until the run ends (True) or we leave (False).
        `until`: a time.monotonic() deadline."""
        attached = kept.lock_file(os.path.join(self.path, "attached"), fcntl.LOCK_SH)
        kept.renew(self.path)
        self.renewed = time.monotonic()
        watch = _watch(self.path)
        try:
            self._send(protocol.MAGIC)
            while True:
                self._read_new()
                if self.reading.ended:
                    return True
                hello = protocol.HELLO in self.reading.seen  # (a detached event comes after it)
                if hello and (until_placed and self.reading.placed
                              or until is not None and time.monotonic() >= until):
                    self._send(self.reading.detached(self.run_id, self.lease_s, time.time()))
                    return False
                if not kept.held(os.path.join(self.path, "alive")):
                    self._read_new()  # its last words, written before it let go
                    return self.reading.ended
                if time.monotonic() >= self.renewed + RENEW_S:
                    kept.renew(self.path)
                    self.renewed = time.monotonic()
                heard = self._wait(watch, until)
                if heard == "leave":  # our client was stopped: it leaves, the run goes on
                    self._send(self.reading.detached(self.run_id, self.lease_s, time.time()))
                if heard != "go":
                    return False
        finally:
            _write_pos(self.path, self.read_upto)
            kept.renew(self.path)
            if attached is not None:
                os.close(attached)
            if watch is not None:
                watch.close()

    def _wait(self, watch: Watcher | None, until: float | None) -> str:
        """Until the log changes (or a moment passes): "go" on; "leave" if
        our client says `cancel` (it was stopped), "gone" if it closed our
        stdin."""
        timeout = POLL_S if watch is None else RENEW_S
        if until is not None:
            timeout = max(0.0, min(timeout, until - time.monotonic()))
        fds = [self.in_fd] + ([watch.fileno()] if watch is not None else [])
        ready, _, _ = select.select(fds, [], [], timeout)
        if self.in_fd in ready:
            try:
                data = os.read(self.in_fd, 4096)
            except OSError:
                data = b""
            if not data:
                return "gone"
            if b"cancel" in data:
                return "leave"
        if watch is not None and watch.fileno() in ready:
            watch.drain()
        return "go"

    def _read_new(self) -> None:
        for start, name in kept.segments(self.path):
            try:
                size = os.stat(name).st_size
            except FileNotFoundError:
                continue  # dropped meanwhile: the next one shows the gap
            if start + size <= self.pos:
                continue
            if start > self.pos:
                if self.pos and start > self.start_pos:
                    self._send(kept.dropped_note(start - self.pos, self._head()))
                self.pos = start
            try:
                with open(name, "rb") as f:
                    f.seek(self.pos - start)
                    data = f.read(size - (self.pos - start))
            except FileNotFoundError:
                continue
            if start == 0 and self.pos == 0:
                data = data[len(protocol.MAGIC):] if data.startswith(protocol.MAGIC) else data
                self.pos = len(protocol.MAGIC)
            frames, used = kept.split_frames(data)
            at = self.pos
            for kind, payload in frames:
                self._frame(kind, payload, at)
                at += protocol.HEADER_SIZE + len(payload)
            self.pos += used
            if used < len(data):
                return  # a frame still being written: the rest comes later

    def _frame(self, kind: bytes, payload: bytes, at: int) -> None:
        if kind != protocol.EVENT:
            if at >= self.start_pos:
                self._send(protocol.frame(kind, payload))
                self.read_upto = at + protocol.HEADER_SIZE + len(payload)
            return
        name = self.reading.note(payload)
        if name == protocol.QUEUED and at < self.start_pos:
            return  # an old report: the newer ones say where the run is
        if name == protocol.HELLO:
            ev = from_json(payload.decode("utf-8", "replace"), protocol.EVENT_DEPTH)
            request = self.terms.get("request")
            if isinstance(ev, dict) and isinstance(request, dict):
                ev["request"], ev["lease_s"] = request, self.lease_s
                if isinstance(self.terms.get("credit_dir"), str):
                    ev["credit_dir"] = self.terms["credit_dir"]
                payload = to_json(ev).encode()
        self._send(protocol.frame(kind, payload))

    def _head(self) -> int:
        limit = self.terms.get("log_max")
        return (int(limit) if isinstance(limit, int) else kept.KEPT_MAX_BYTES) // 2

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except BlockingIOError:
                select.select([], [self.out_fd], [])
                continue
            view = view[n:]


def _watch(path: str) -> Watcher | None:
    from . import inotify

    if not inotify.available():
        return None
    w = inotify.Watcher()
    if not w.watch(path, inotify.IN_MODIFY | inotify.IN_CREATE | inotify.IN_CLOSE_WRITE | inotify.IN_DELETE):
        w.close()
        return None
    return w


def _read_pos(path: str) -> int:
    try:
        with open(os.path.join(path, "read"), "rb") as f:
            text = f.read(32).strip()
        return int(text) if text.isdigit() else 0
    except OSError:
        return 0


def _write_pos(path: str, pos: int) -> None:
    try:
        kept.write_file(os.path.join(path, "read"), b"%d\n" % pos)
    except OSError:
        pass
