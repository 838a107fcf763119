"""Fuzzing the two untrusted inputs of issue 11, in a process of its own
(so its peak memory can be measured): the host's stream as the client reads
it, and run requests as the host reads them.

    python tests/strict_fuzz.py CASES SEED   ->  one JSON line of figures

Every stream case is hostile by construction (random bytes, a corrupt or
oversized frame, a malformed or out-of-order event, noise past the cap, a
`passed` for a command never shown starting); each must end in bounded
time with `unavailable` -- or a usage/state error the host announced --
and never exit 0. Every request must parse or raise ValueError."""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time

from slotq import protocol
from slotq.client.caller import run
from slotq.errors import SlotqError
from slotq.outcome import Outcome
from slotq.spec import RunSpec
from slotq.transports.base import Transport

CASE_LIMIT_S = 5.0


class StreamTransport(Transport):
    """A 'host' that sends fixed bytes and ends."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._t: threading.Thread | None = None

    def start(self, spec: RunSpec) -> tuple[int, int]:
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        os.close(to_r)  # nobody reads what the client says

        def feed() -> None:
            try:
                view = memoryview(self.data)
                while view:
                    view = view[os.write(from_w, view[:65536]):]
            except OSError:
                pass  # the client stopped reading: fine
            finally:
                os.close(from_w)

        self._t = threading.Thread(target=feed, daemon=True)
        self._t.start()
        return to_w, from_r

    def kill(self) -> None:
        pass

    def wait(self) -> str:
        if self._t is not None:
            self._t.join(5)
        return ""


def ev(name: str, **fields: object) -> bytes:
    return protocol.event_frame(name, 1.0, **fields)


HELLO = ev("hello", protocol=protocol.PROTOCOL_VERSION, version="x", host="h", pid=1, run_id="r")


def hostile(rng: random.Random) -> bytes:
    """One stream that no honest host sends."""
    kind = rng.randrange(12)
    junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300)))
    if kind == 0:  # random bytes, maybe with the header in front
        return (protocol.MAGIC if rng.random() < 0.5 else b"") + junk
    if kind == 1:  # a frame claiming a huge length
        return protocol.MAGIC + HELLO + rng.choice(b"OEV").to_bytes(1, "big") + \
            rng.choice([2**31, 2**32 - 1, protocol.MAX_FRAME + 1]).to_bytes(4, "big") + junk
    if kind == 2:  # an event frame with random payload
        return protocol.MAGIC + HELLO + protocol.frame(protocol.EVENT, junk)
    if kind == 3:  # deep nesting
        depth = rng.choice([7, 64, 5000])
        return protocol.MAGIC + HELLO + protocol.frame(protocol.EVENT, b"[" * depth + b"]" * depth)
    if kind == 4:  # an unknown outcome, or wrong-typed fields
        fields: dict[str, object] = rng.choice([{"outcome": "pwned"}, {"outcome": 7}, {"outcome": "passed", "exit_code": "0"},
                             {"outcome": "failed", "phases": [1]}, {"outcome": "passed", "phases": {"slot": "x"}},
                             {"outcome": None}])
        return protocol.MAGIC + HELLO + ev("started", budget=1.0) + ev("exited", **fields)
    if kind == 5:  # passed/failed for a command never shown starting
        return protocol.MAGIC + HELLO + ev("slot", slot="s#0", waited_s=0.0, budget=1.0) + \
            ev("exited", outcome=rng.choice(["passed", "failed", "exec_timeout"]), exit_code=0, message="ok",
               phases={})
    if kind == 6:  # noise past the cap before the header
        return b"x" * (protocol.MAX_NOISE + 1 + rng.randrange(1000)) + protocol.MAGIC + HELLO
    if kind == 7:  # a wrong protocol version, or a broken header
        return rng.choice([b"\x00SLOTQ-STREAM 99\n", b"\x00SLOTQ-STREAM " + b"9" * 100]) + HELLO
    if kind == 8:  # events before hello, or after exited
        if rng.random() < 0.5:
            return protocol.MAGIC + ev("started", budget=1.0)
        return protocol.MAGIC + HELLO + ev("started", budget=1.0) + ev(
            "exited", outcome="passed", exit_code=0, message="", phases={}) + ev("started", budget=1.0)
    if kind == 9:  # non-finite numbers and wrong types in known fields
        body = rng.choice([b'{"event":"slot","at":1e999,"slot":"s"}', b'{"event":"queued","at":1,"ahead":"x"}',
                           b'{"event":"started","at":1,"budget":true}', b'{"event":"hello","at":1}',
                           b'{"event":"prepared","at":1,"ok":1}', b'{"event":"nope","at":1}', b'[1,2]',
                           b'{"event":"exited","at":1,"outcome":"passed","phases":{"a":{"b":1}}}'])
        return protocol.MAGIC + HELLO + protocol.frame(protocol.EVENT, body)
    if kind == 10:  # a stream that just stops (truncated frame or no exited)
        good = protocol.MAGIC + HELLO + ev("started", budget=1.0) + protocol.frame(protocol.STDOUT, b"out")
        return good[: rng.randrange(1, len(good) + 1)]
    # a valid prefix, then random bytes where a frame header should be
    return protocol.MAGIC + HELLO + ev("started", budget=1.0) + junk[:5] + b"\xff" * 5


def fuzz_streams(cases: int, rng: random.Random) -> dict[str, object]:
    devnull = os.open(os.devnull, os.O_WRONLY)
    outcomes: dict[str, int] = {}
    slowest = 0.0
    for i in range(cases):
        data = hostile(rng)
        spec = RunSpec(["true"], run_id=f"fuzz{i}")
        t0 = time.monotonic()
        try:
            result = run(spec, StreamTransport(data), stdout_fd=devnull, stderr_fd=devnull,
                         ledger_path=os.environ["SLOTQ_LEDGER"])
            key = result.outcome.value
            if result.outcome is not Outcome.UNAVAILABLE or result.exit_code == 0:
                raise AssertionError(f"case {i}: {key} (exit {result.exit_code}) for {data[:200]!r}")
        except SlotqError as e:
            key = f"error {e.exit_code}"
            if e.exit_code not in (64, 73):
                raise
        slowest = max(slowest, time.monotonic() - t0)
        if slowest > CASE_LIMIT_S:
            raise AssertionError(f"case {i} took {slowest:.1f}s")
        outcomes[key] = outcomes.get(key, 0) + 1
    return {"stream_cases": cases, "stream_outcomes": outcomes, "slowest_case_s": round(slowest, 3)}


def random_request(rng: random.Random) -> bytes:
    values: list[object] = [None, True, 0, -1, 1, 1.5, 1e308, "10", "", "a\u0000b", [], {}, ["x"], [1],
                            "/etc", "../x", "x" * 70, 2**70]
    fields = ["argv", "cls", "budget", "prepare", "prepare_timeout", "label", "report_every", "kill_grace",
              "run_id", "work_id", "cwd", "max_wait", "bogus"]
    req: dict[str, object] = {"argv": ["true"]} if rng.random() < 0.7 else {}
    for _ in range(rng.randrange(0, 5)):
        req[rng.choice(fields)] = rng.choice(values)
    text = json.dumps(req)
    mode = rng.randrange(6)
    if mode == 0:
        text = text.replace("1.5", "NaN").replace("1e+308", "Infinity")
    elif mode == 1:
        text = "[" * rng.choice([5, 100, 5000])
    elif mode == 2 and text:
        cut = rng.randrange(len(text))
        text = text[:cut] + chr(rng.randrange(32, 127)) + text[cut + 1:]
    return text.encode()


def fuzz_requests(cases: int, rng: random.Random) -> dict[str, object]:
    ok = bad = 0
    for i in range(cases):
        line = random_request(rng)
        try:
            spec = RunSpec.from_request(line)
        except ValueError:
            bad += 1
            continue
        ok += 1
        for key in ("budget", "prepare_timeout", "kill_grace", "max_wait", "report_every"):
            v = getattr(spec, key)
            if v is not None and not (isinstance(v, float) and 0 <= v <= 30 * 86400):
                raise AssertionError(f"case {i}: {key}={v!r} accepted from {line!r}")
        if not all(isinstance(a, str) and "\0" not in a for a in spec.argv):
            raise AssertionError(f"case {i}: argv {spec.argv!r} accepted")
    return {"request_cases": cases, "requests_accepted": ok, "requests_refused": bad}


def main() -> int:
    cases, seed = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    t0 = time.monotonic()
    report = fuzz_streams(cases, rng)
    report.update(fuzz_requests(cases, rng))
    report["elapsed_s"] = round(time.monotonic() - t0, 2)
    # This process's own peak (VmHWM), not getrusage's ru_maxrss: Linux
    # keeps that across exec, so a child of a large pytest process (the
    # suite grows past 100 MB once the MCP SDK is imported) would report
    # its parent's size.
    with open("/proc/self/status") as f:
        peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    report["max_rss_mb"] = round(peak_kb / 1024, 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
