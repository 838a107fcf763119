"""Issue 65: the attacks a hostile second member of a shared pool (B,
`slotqb`) still had against another (A, `slotqa`), one test a row, each
played as the real second user against A's real runs. docs/trust.md
names the test of each row."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import wait_for
from shared_world import GROUP, SKIP_WHY, USERS, World, world  # noqa: F401 (world: a fixture)

pytestmark = pytest.mark.skipif(os.getuid() != 0 or len(USERS) < 2 or not GROUP, reason=SKIP_WHY)


def _pool(w: World, pool: str = "shared") -> Any:
    proc = w.run(w.a, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return next(p for p in json.loads(proc.stdout)["pools"] if p["pool"] == pool)


# B's tickets made the way slotq makes them: the counter locked, the next
# numbers linked in, the counter written; then held, never claiming.
HELD_TICKETS = """\
import fcntl, json, os, sys
state, pool, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
pdir = os.path.join(state, 'tickets', pool)
seq_fd = os.open(os.path.join(state, 'seq'), os.O_RDWR)
fcntl.flock(seq_fd, fcntl.LOCK_EX)
raw = os.pread(seq_fd, 32, 0).strip()
seq = max([int(raw) if raw.isdigit() else 0] + [int(x[:-2]) for x in os.listdir(pdir) if x.endswith('.t')])
fds = []
for _ in range(n):
    seq += 1
    tmp = os.path.join(pdir, '.b%d.tmp' % seq)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({'run_id': 'b%d' % seq, 'label': 'held by hand', 'pid': os.getpid()}).encode())
    os.link(tmp, os.path.join(pdir, '%016d.t' % seq))
    os.unlink(tmp)
    fds.append(fd)
os.pwrite(seq_fd, b'%020d\\n' % seq, 0)
os.close(seq_fd)
print('ready', flush=True)
sys.stdin.read()
"""


def _run_json(w: World, user: str, *args: str) -> dict[str, Any]:
    proc = w.run(user, "run", "--json", "-", "-q", *args)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.splitlines()[-1]))


# ---------------------------------------------------------------- row 1: a chain of held tickets

@pytest.mark.timeout(120)
@pytest.mark.parametrize("held", [2, 5])
def test_row1_a_chain_of_tickets_held_by_hand_costs_the_line_one_claim_window(world: World, held: int) -> None:
    w = world
    with w.by_hand(w.b, HELD_TICKETS, str(w.state), "shared", str(held)):
        assert len(_pool(w)["waiting"]) == held
        started = time.monotonic()
        mine = w.popen(w.a, "run", "-q", "--json", str(w.home(w.a) / "r.json"), "--", "true")
        # Today: it waits for ever, the slot free (only the waiter right
        # behind the head judged it, and that waiter was B's second ticket).
        assert mine.wait(timeout=60) == 0
        took = time.monotonic() - started
        # One claim window (5 s) and the grace for the head's owner's
        # other tickets (3 s), after a look at most LOOK_MOST (10 s) away.
        assert took < 25, took
        assert json.loads((w.home(w.a) / "r.json").read_text())["outcome"] == "passed"
        assert len(_pool(w)["waiting"]) == held  # B's places are kept


# ---------------------------------------------------------------- row 2: the ticket counter

@pytest.mark.timeout(90)
@pytest.mark.parametrize("value", [b"999999999999999999\n", b"1000000000000000000\n", b"99999999999999999999\n",
                                   b"-5\n", b"garbage\n", b"", b"9" * 4096, b"000000000000000000000000000001\n"])
def test_row2_no_value_written_into_the_counter_exhausts_or_jumps_the_numbers(world: World, value: bytes) -> None:
    w = world
    first = _run_json(w, w.a, "--", "true")["ticket"]
    code = f"fd = __import__('os').open({str(w.state / 'seq')!r}, 1 | 512); __import__('os').write(fd, {value!r})"
    assert w.py(w.b, code).returncode == 0  # (O_WRONLY | O_TRUNC)
    after = _run_json(w, w.a, "--", "true")["ticket"]  # before, 10^18-1: exit 73 for every run of every pool
    now_us = time.time_ns() // 1000
    # A ticket's number is the microsecond it was taken: nothing written
    # into the counter moved it, nor ran the numbers out.
    assert first < after <= now_us, (first, after, now_us)
    landing = _run_json(w, w.a, "--class", "landing", "--", "true")["ticket"]
    assert after < landing <= time.time_ns() // 1000
