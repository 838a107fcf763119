"""A hostile member of a shared pool (issue 44's chaos test): run as user B
for a while, it does at random everything B can do to the pool's files --
forged holder records, planted names and links, huge files, locks and
tickets held by hand (one of them until the end, from its third second), silent connections to runs' sockets, garbage in the
counter -- and lets go of all of it when it ends.

    python hostile.py STATE_DIR SECONDS SEED

Standard library only (it runs as another user, from anywhere). Prints
one line per kind of act at the end: how often it did it."""

from __future__ import annotations

import fcntl
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter


# A ticket made and held by a process that does nothing else.
TICKET_HOLDER = ("import fcntl, os, sys\n"
                 "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)\n"
                 "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, sys.argv[2].encode())\n"
                 "print('ready', flush=True)\nsys.stdin.read()\n")


class Hostile:
    def __init__(self, state: str, seed: int) -> None:
        self.state = state
        self.rnd = random.Random(seed)
        self.held: list[tuple[float, object]] = []  # (release at, fd or socket)
        self.done: Counter[str] = Counter()
        self.children: list[subprocess.Popen[bytes]] = []

    def path(self, *parts: str) -> str:
        return os.path.join(self.state, *parts)

    def tickets(self) -> list[str]:
        try:
            return sorted(os.listdir(self.path("tickets", "shared")))
        except OSError:
            return []

    def run_ids(self) -> list[str]:
        out = []
        for name in self.tickets():
            try:
                with open(self.path("tickets", "shared", name), "rb") as f:
                    rid = json.loads(f.read(65536)).get("run_id")
            except (OSError, ValueError, AttributeError, RecursionError):
                continue
            if isinstance(rid, str):
                out.append(rid)
        return out

    def hold(self, seconds: float, thing: object) -> None:
        self.held.append((time.monotonic() + seconds, thing))

    def let_go(self, everything: bool = False) -> None:
        now = time.monotonic()
        keep = []
        for until, thing in self.held:
            if everything or until <= now:
                if isinstance(thing, int):
                    os.close(thing)
                else:
                    thing.close()  # type: ignore[attr-defined]
            else:
                keep.append((until, thing))
        self.held = keep

    # ---------------------------------------------------------------- the acts

    def forge_slot(self) -> None:
        slot = self.path("slots", self.rnd.choice(["shared.0", "landing.0"]))
        try:
            with open(slot, "rb") as f:
                record = json.loads(f.read(65536) or b"{}")
        except (OSError, ValueError, RecursionError):  # (its own garbage of a moment ago)
            record = {}
        if not isinstance(record, dict) or not record.get("run_id"):
            ids = self.run_ids()
            record = {"run_id": self.rnd.choice(ids) if ids else "deadbeef", "label": "forged", "pid": 1,
                      "phase": "running", "cls": "shared"}
        record.update(pid_start=1, keeper_start=1, cmd_start=1, keeper=1, cmd=1)
        data = json.dumps(record).encode() if self.rnd.random() < 0.8 else b"[" * 5000
        fd = os.open(slot, os.O_WRONLY)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def plant_name(self) -> None:
        d = self.path("tickets", "shared")
        name = self.rnd.choice([f"{10 ** 17 - 1:016d}.t", f"{self.rnd.randrange(1, 10 ** 6):016d}.t",
                                ".%d.tmp" % self.rnd.randrange(10 ** 6), "not-a-ticket"])
        target = os.path.join(d, name)
        try:
            if self.rnd.random() < 0.5:
                os.symlink("/etc/passwd", target)
            else:
                open(target, "w").close()
        except OSError:
            pass

    def huge_files(self) -> None:
        for target in (self.path("history.jsonl"), self.path("history", f"u{os.getuid()}.jsonl")):
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
            except OSError:
                continue
            try:
                os.ftruncate(fd, 1 << 30)
                os.lseek(fd, 0, os.SEEK_END)
                os.write(fd, b'{"label": "' + b"x" * (1 << 20) + b'"}\n')
            finally:
                os.close(fd)

    def raw_lock(self) -> None:
        fd = os.open(self.path("slots", self.rnd.choice(["shared.0", "landing.0"])), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return
        self.hold(self.rnd.uniform(0.1, 0.5), fd)

    def raw_ticket(self, hold: float | None = None) -> bool:
        """A real place in line, taken as slotq takes one (the next number,
        under the counter's lock), with no slotq behind it. `hold=None`:
        held by us for a few seconds; else by a process that does nothing
        else (as `flock TICKET sleep inf` would) for `hold` seconds."""
        seq_fd = os.open(self.path("seq"), os.O_RDWR)
        try:
            try:
                fcntl.flock(seq_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # (held: by us, maybe -- `counter`)
            raw = os.pread(seq_fd, 32, 0).strip()
            names = [n for n in self.tickets() if n.endswith(".t") and n[:-2].isdigit() and len(n) == 18]
            live = [int(n[:-2]) for n in names if int(n[:-2]) < 10 ** 12]
            seq = max([int(raw) if raw.isdigit() and int(raw) < 10 ** 12 else 0, *live]) + 1
            path = self.path("tickets", "shared", f"{seq:016d}.t")
            body = self.rnd.choice([b"garbage", json.dumps({"run_id": "b-raw", "label": "raw"}).encode(),
                                    b'{"label": "' + b"y" * 70000 + b'"}'])
            if hold is not None:
                holder = subprocess.Popen([sys.executable, "-c", TICKET_HOLDER, path, body.decode()],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                self.children.append(holder)
                assert holder.stdout is not None and holder.stdin is not None
                if holder.stdout.readline() != b"ready\n":
                    return False
                self.hold(hold, holder.stdin)
            else:
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                except OSError:
                    return False
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, body)
                self.hold(self.rnd.uniform(1.0, 6.0), fd)
            os.pwrite(seq_fd, b"%020d\n" % seq, 0)
        finally:
            os.close(seq_fd)
        return True

    def silent_connect(self) -> None:
        try:
            with open("/proc/net/unix", "rb") as f:
                names = [line.split()[-1] for line in f.read().splitlines()[1:]
                         if line.split()[-1].startswith(b"@slotq-run/")]
        except OSError:
            return
        for name in names[:4]:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(b"\0" + name[1:])
            except OSError:
                s.close()
                continue
            self.hold(1.0, s)

    def counter(self) -> None:
        fd = os.open(self.path("seq"), os.O_RDWR)
        if self.rnd.random() < 0.5:
            os.pwrite(fd, b"99999999999999999999\n", 0)
            os.close(fd)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return
        self.hold(0.2, fd)

    def forge_history(self) -> None:
        ids = self.run_ids()
        line = {"run_id": self.rnd.choice(ids) if ids else "x", "uid": 0, "outcome": "failed", "label": "forged",
                "phases": {"ended": time.time()}}
        with open(self.path("history", f"u{os.getuid()}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")

    def act(self) -> None:
        # A slot or a place in line held by hand is B's to hold (status names
        # it); a place costs every run behind it the claim window
        # (host/claim.py) when it reaches the head. Rarely, then, or the
        # line would be nothing but B's and A's test would measure only that.
        name = self.rnd.choices(["forge_slot", "plant_name", "raw_lock", "raw_ticket", "silent_connect",
                                 "counter", "forge_history"], weights=[20, 10, 2, 1, 10, 4, 5])[0]
        try:
            getattr(self, name)()
            self.done[name] += 1
        except OSError:
            self.done[name + " (refused)"] += 1


def main() -> None:
    state, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    b = Hostile(state, seed)
    b.huge_files()
    b.done["huge_files"] += 1
    print("ready", flush=True)
    end = time.monotonic() + seconds
    for_good = time.monotonic() + 3.0
    for_good_at = 0.0
    while time.monotonic() < end:
        if for_good and time.monotonic() >= for_good and b.raw_ticket(hold=1e9):  # until the end
            for_good = 0.0
            for_good_at = time.time()
            b.done["ticket_for_good"] += 1
        b.act()
        b.let_go()
        time.sleep(b.rnd.uniform(0.02, 0.1))  # sleep-ok: the pace of the attacks, not a wait for a condition
    b.let_go(everything=True)
    for child in b.children:
        child.wait()  # (its stdin closed: it ends)
    print(f"end {time.time()!r}")
    print(f"for_good_at {for_good_at!r}")
    for name, n in sorted(b.done.items()):
        print(f"{name} {n}")


if __name__ == "__main__":
    main()
