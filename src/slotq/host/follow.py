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
from ..spec import REPORT_EVERY
from . import kept

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..history.eta import Basis
    from .inotify import Watcher

POLL_S = 0.5  # without inotify: how often the log is looked at
# A run in line that has not reported for its report period and this much
# more (its process waits away as a shell, host/away.py, or is quiet): the
# attacher looks at the line itself and says what the run's report would.
QUIET_MARGIN = 2.0
HISTORY_WAIT_S = 3.0  # a run's process gone without a result: how long its history line may take
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
        self.read_upto = self.start_pos  # past the last frame sent: where the next attacher starts
        self.until_placed = False
        self.last_report: dict[str, object] | None = None  # the newest `queued` report read
        self.catching_up = True  # the first read: what the log holds from before we came
        request = self.terms.get("request")
        every = request.get("report_every") if isinstance(request, dict) else None
        self.report_every = float(every) if isinstance(every, (int, float)) and every > 0 else REPORT_EVERY
        self.margin = min(QUIET_MARGIN, self.report_every / 2)
        self.look_at = time.monotonic() + self.report_every + self.margin  # when we report, if the run has not
        self.typical: Basis | None = None  # the pool's typical run, for our reports' ETA (lineview.report)

    def follow(self, until: float | None = None, until_placed: bool = False) -> bool:
        """Send the stream until the run ends (True) or we leave (False).
        `until`: a time.monotonic() deadline."""
        self.until_placed = until_placed
        attached = kept.lock_file(os.path.join(self.path, "attached"), fcntl.LOCK_SH)
        kept.renew(self.path)
        self.renewed = time.monotonic()
        watch = _watch(self.path)
        try:
            self._send(protocol.MAGIC)
            while True:
                self._read_new()
                if self.catching_up:
                    self.catching_up = False
                    self._report_now()
                if self.reading.ended:
                    return True
                if time.monotonic() >= self.look_at:
                    self._look_ourselves()
                hello = protocol.HELLO in self.reading.seen  # (a detached event comes after it)
                if hello and (until_placed and self.reading.placed
                              or until is not None and time.monotonic() >= until):
                    self._send(self.reading.detached(self.run_id, self.lease_s, time.time()))
                    return False
                if not kept.held(os.path.join(self.path, "alive")):
                    self._read_new()  # its last words, written before it let go
                    return self.reading.ended or self._end_from_history()
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
        timeout = min(POLL_S if watch is None else RENEW_S, max(0.0, self.look_at - time.monotonic()))
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
                if self.until_placed and self.reading.placed and protocol.HELLO in self.reading.seen:
                    self.pos = at  # `run --detach`: nothing past the place (its output is the next attach's)
                    return
            self.pos += used
            if used < len(data):
                return  # a frame still being written: the rest comes later

    def _report_now(self) -> None:
        """What an attacher sees of a run still in line: where it is now --
        the newest report the log holds, its wait brought up to now, once
        -- then the reports as they come; never every report since the run
        began (an hour of them at 5 s, to an MCP client, was 720
        notifications, the first a stale `waiting 1ms`)."""
        report = self.last_report
        if report is None or protocol.SLOT in self.reading.seen or self.reading.ended:
            return
        at, waited = report.get("at"), report.get("waited_s")
        now = time.time()
        if isinstance(at, (int, float)) and isinstance(waited, (int, float)) and not isinstance(waited, bool):
            report = dict(report, at=now, waited_s=round(float(waited) + max(0.0, now - float(at)), 3))
        self._send(protocol.frame(protocol.EVENT, to_json(report).encode()))

    def _end_from_history(self) -> bool:
        """The run's process is gone without its last word (killed: waiting
        away, its watcher writes its history line; in line or running, its
        keeper does). Its end as that line tells it, once it is there (a
        moment: at most HISTORY_WAIT_S); False if it never comes."""
        give_up = time.monotonic() + HISTORY_WAIT_S
        while True:
            rec, _ = _history_of(self.run_id)
            if rec is not None:
                self._send(_history_events(self.run_id, rec, time.time())[-1])  # its `exited`
                return True
            if time.monotonic() >= give_up:
                return False
            time.sleep(0.1)

    def _look_ourselves(self) -> None:
        """The run waits and has said nothing for a report period: its
        process waits away, or is quiet. What its report would say now --
        its place, the holders, the load, the expected wait -- from our own
        look at the line (lineview.Onlooker), its wait brought up to now."""
        self.look_at = time.monotonic() + self.report_every
        last = self.last_report
        if last is None or protocol.SLOT in self.reading.seen or self.reading.ended:
            return
        pool, seq, at, waited = (last.get(k) for k in ("pool", "ticket", "at", "waited_s"))
        if not (isinstance(pool, str) and isinstance(seq, int) and isinstance(at, (int, float))
                and isinstance(waited, (int, float))) or isinstance(seq, bool):
            return
        from ..config import HostConfig, state_dir_from_env
        from ..errors import SlotqError
        from . import lineview

        try:
            state_dir = self.terms.get("state_dir")
            state_dir = state_dir if isinstance(state_dir, str) else state_dir_from_env()
            slots = HostConfig.load(state_dir=state_dir).pools.get(pool)
            if not slots:
                return
            now = time.time()
            fields, self.typical = lineview.report(state_dir, pool, lineview.Onlooker(state_dir, pool, seq, slots),
                                                   now, lambda table: [], self.typical, True)
        except (OSError, SlotqError):
            return  # no look to be had: the run's own next report, or none
        waited_s = round(float(waited) + max(0.0, now - float(at)), 3)
        self._send(protocol.event_frame(protocol.QUEUED, now, waited_s=waited_s, **fields, ticket=seq,
                                        budget=last.get("budget")))

    def _frame(self, kind: bytes, payload: bytes, at: int) -> None:
        end = at + protocol.HEADER_SIZE + len(payload)
        if kind != protocol.EVENT:
            if at >= self.start_pos:
                self._send(protocol.frame(kind, payload))
                self.read_upto = end
            return
        name = self.reading.note(payload)
        if name == protocol.QUEUED:
            ev = from_json(payload.decode("utf-8", "replace"), protocol.EVENT_DEPTH)
            self.last_report = ev if isinstance(ev, dict) else self.last_report
            self.look_at = time.monotonic() + self.report_every + self.margin
            if self.catching_up:
                return  # a past report: only the newest is shown (_report_now)
        self.read_upto = max(self.read_upto, end)
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
        protocol.write_all(self.out_fd, data)


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


def attach(run_id: str, out_fd: int, in_fd: int, attach_for: float | None, from_start: bool) -> None:
    """`slotq host attach`: run `run_id`'s stream on `out_fd` (the caller's
    channel on `in_fd`), at most `attach_for` seconds; a run whose result
    was taken already: its history line, as a stream."""
    prune()
    try:
        path = kept.open_run_dir(run_id)
    except kept.KeptError as e:
        _from_history(run_id, str(e), out_fd)
        return
    follow(path, out_fd, in_fd, attach_for, False, from_start)


def follow(path: str, out_fd: int, in_fd: int, attach_for: float | None, until_placed: bool,
           from_start: bool) -> None:
    """Follow the kept run in `path`; if it ended meanwhile, its result is
    taken (its directory goes)."""
    until = None if attach_for is None else time.monotonic() + attach_for
    if Follower(path, out_fd, in_fd, from_start=from_start).follow(until, until_placed):
        _result_taken(path)


def _result_taken(path: str) -> None:
    """The run's result was delivered: its directory goes, once its process
    is gone and nobody else is attached (else the next prune takes it)."""
    from . import kept

    kept.write_file(os.path.join(path, "taken"), b"")
    _until_gone(os.path.join(path, "alive"), 5.0)  # it writes its history line, then goes: a moment
    _remove_if_done(path)


def _until_gone(lock: str, seconds: float) -> None:
    """Wait (at most `seconds`) until nobody holds `lock`."""
    import fcntl

    from ..history import lock_within

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

    from . import kept

    if kept.held(os.path.join(path, "alive")):
        return
    attached = kept.lock_file(os.path.join(path, "attached"), fcntl.LOCK_EX)
    if attached is None:
        return
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(attached)


def prune() -> None:
    """Kept runs whose result was taken, or that ended longer ago than the
    history keeps runs, go."""
    from slotq.config import HostConfig
    from . import kept

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


def _history_of(run_id: str) -> tuple[dict[str, object] | None, list[str]]:
    """Our history line of run `run_id` (the newest), and if there is none,
    who else's lines name it."""
    from ..config import HostConfig, state_dir_from_env
    from ..history.index import Index

    state_dir = state_dir_from_env()
    index = Index(state_dir, HostConfig.load(state_dir=state_dir).retention)
    try:
        index.catch_up()
        rec = index.find(run_id)
        others = [] if rec is not None else sorted({str(r.get("recorded_by") or r.get("user") or "?")
                                                    for r in index.claims(run_id)})
    finally:
        index.close()
    return rec, others


def _history_events(run_id: str, rec: dict[str, object], now: float) -> list[bytes]:
    """The stream of a run told by its history line `rec`: hello, its
    place or slot, its start, exited."""
    from .. import __version__

    out = []

    def event(name: str, at: object, **fields: object) -> None:
        out.append(protocol.event_frame(name, float(at) if isinstance(at, (int, float)) else now, **fields))

    ph: dict[str, object] = rec["phases"]  # type: ignore[assignment]
    request = {"argv": ["?"], "run_id": run_id, "label": rec.get("label"), "cls": rec.get("class"),
               "submitted": ph.get("submitted"), "budget": rec.get("budget")}
    event(protocol.HELLO, now, protocol=protocol.PROTOCOL_VERSION, version=__version__,
          request={k: v for k, v in request.items() if v is not None})
    if ph.get("slot") is None and rec.get("ticket") is not None:
        event(protocol.QUEUED, ph.get("submitted"), waited_s=0.0, ticket=rec.get("ticket"),
              budget=rec.get("budget"))  # its place's number, though it never had a slot
    if ph.get("slot") is not None:
        event(protocol.SLOT, ph["slot"], slot=str(rec.get("slot") or "?"), ticket=rec.get("ticket"),
              **({"budget": rec["budget"]} if rec.get("budget") is not None else {}))
    if ph.get("started") is not None:
        event(protocol.STARTED, ph["started"])
    code = rec.get("exit_code")
    event(protocol.EXITED, ph.get("ended"), outcome=str(rec.get("outcome")),
          exit_code=code if isinstance(code, int) else None, message=str(rec.get("message") or ""),
          phases={k: v for k, v in ph.items() if k in ("submitted", "slot", "prepared", "started", "ended")})
    return out


def _from_history(run_id: str, why: str, out_fd: int) -> None:
    """A run whose directory is gone: its result from the history, as a
    stream (hello, its phases, exited); or an error saying there is none."""
    from .. import __version__
    from ..records import printable

    rec, others = _history_of(run_id)
    now = time.time()
    if rec is None:
        what = f"{why} (nor in its history" + (
            f": only a line by {printable(', '.join(others), 200)} names it, not a record of yours)" if others else ")")
        events = [protocol.event_frame(protocol.HELLO, now, protocol=protocol.PROTOCOL_VERSION, version=__version__),
                  protocol.event_frame(protocol.ERROR, now, kind="no_run", message=what)]
    else:
        events = _history_events(run_id, rec, now)
    protocol.write_all(out_fd, protocol.MAGIC + b"".join(events))
