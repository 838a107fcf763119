"""The stream from host runner to client: versioned and framed.

    MAGIC  then frames:  kind (1 byte) | length (4 bytes, big-endian) | payload

kinds: `O` command stdout bytes, `E` command stderr bytes, `V` an event: a
dict with at least "event" and "at" (wall-clock seconds on the host), in
`marshal` format version 4 (str keys; str, int, float, bool, None, list and
dict values). marshal rather than JSON because it is built in: `json` pulls
in `re`, a real share of a run's start-up. Both ends are slotq; the version
in MAGIC names the format. marshal is not hardened against malicious input:
the peer is the test host the caller chose to run its code on.
The command's output only ever travels inside O/E frames, so nothing it
prints -- "slot acquired", a fake frame header, binary garbage -- can be read
as an event, and bytes pass through unchanged.

Bytes before MAGIC (a login shell's greeting on a remote host) are skipped
and handed back to the caller as noise.

The other direction, client to runner, is the runner's stdin: text lines
`cancel <reason>`; end-of-file means the caller is gone.
"""

from __future__ import annotations

import marshal

from .errors import ProtocolError

PROTOCOL_VERSION = 1
MAGIC = b"\x00SLOTQ-STREAM %d\n" % PROTOCOL_VERSION
MAGIC_PREFIX = b"\x00SLOTQ-STREAM "
STDOUT, STDERR, EVENT = b"O", b"E", b"V"
HEADER_SIZE = 5
MAX_FRAME = 16 * 1024 * 1024

# Event names.
HELLO = "hello"
QUEUED = "queued"
SLOT = "slot"
PREPARED = "prepared"
STARTED = "started"
EXITED = "exited"
ERROR = "error"


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def event_frame(name: str, at: float, **fields: object) -> bytes:
    body: dict[str, object] = {"event": name, "at": at}
    body.update(fields)
    return frame(EVENT, marshal.dumps(body, 4))


class Decoder:
    """Incremental reader: `feed(bytes)` returns complete frames as
    (kind, payload) pairs, events decoded to dicts."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._synced = False
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
            if kind not in (STDOUT, STDERR, EVENT) or length > MAX_FRAME:
                raise ProtocolError(f"corrupt frame from the host runner (kind {kind!r}, length {length})")
            if len(buf) - pos - HEADER_SIZE < length:
                break
            start = pos + HEADER_SIZE
            payload = bytes(buf[start : start + length])
            pos = start + length
            if kind == EVENT:
                try:
                    ev = marshal.loads(payload)
                except (ValueError, EOFError, TypeError):
                    raise ProtocolError("undecodable event from the host runner") from None
                if not isinstance(ev, dict) or "event" not in ev or not all(isinstance(k, str) for k in ev):
                    raise ProtocolError("malformed event from the host runner")
                out.append((kind, ev))
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
            return False
        nl = self._buf.find(b"\n", i)
        if nl < 0:
            return False
        version = bytes(self._buf[i + len(MAGIC_PREFIX) : nl])
        if version != str(PROTOCOL_VERSION).encode():
            raise ProtocolError(
                f"the host runner speaks stream protocol {version.decode(errors='replace')}, "
                f"this slotq speaks {PROTOCOL_VERSION}"
            )
        self.noise += self._buf[:i]
        del self._buf[: nl + 1]
        self._synced = True
        return True

    @property
    def pending(self) -> int:
        return len(self._buf)
