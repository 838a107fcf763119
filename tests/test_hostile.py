"""A hostile member of a shared pool, generated rather than listed (issue
65): for every kind of file and name a member (B, `slotqb`) can write in
a pool made by `slotq host init --shared` -- the counter, ticket names,
tickets of B's own, slots taken by hand and their records, a record of a
slot another member holds, the history's files and names, the names a
user's own caches take -- apply the mutations a member can make (garbage,
JSON naming the victim's runs, boundary numbers, empty, huge and sparse,
floods of names, links and FIFOs, locks held, times past and future,
several at once), and after each check the victim's (A, `slotqa`)
invariants:

- A's runs start within a claim window of their slot being free (the
  window and a look: CLAIM_BOUND), in the order A started them;
- none of A's commands is killed or cancelled but by A: each ends as it
  meant to (its exit code), and A's reported outcome -- `run --json`, and
  `attach` of the finished run (the history's word) -- is what it did;
- `slotq status` and `slotq history` answer within a second.

Seeded: $SLOTQ_HOSTILE_SEED picks the cases (printed on failure; a new
one each run otherwise), $SLOTQ_HOSTILE_CASES how many (default 24; `all`
plays every (kind, mutation) pair once). B's hands are tests/hostile_agent.py."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shared_world import GROUP, PY, SKIP_WHY, USERS, World, world  # noqa: F401 (world: a fixture)
from slotq.host.claim import CLAIM_WINDOW, LOOK_MOST, OWNER_GRACE

pytestmark = pytest.mark.skipif(os.getuid() != 0 or len(USERS) < 2 or not GROUP, reason=SKIP_WHY)

AGENT = Path(__file__).resolve().parent / "hostile_agent.py"
CLAIM_BOUND = LOOK_MOST + CLAIM_WINDOW + OWNER_GRACE + 3.0  # a head that never claims, found and passed over
ANSWER_S = 1.0  # status and history answer within this
SLOT_HOLD_S = 1.5  # a slot B takes by hand is let go after this (holding one is B's right: status names it)

Acts = list[dict[str, Any]]


class Ctx:
    """What B knows of A (everything in a shared pool is readable) and
    where things are."""

    def __init__(self, w: World, rnd: random.Random) -> None:
        self.w, self.rnd = w, rnd
        self.state = str(w.state)
        self.a_uid, self.b_uid = w.uid(w.a), w.uid(w.b)
        self.a_runs: list[dict[str, Any]] = []  # A's run records so far

    def path(self, *parts: str) -> str:
        return os.path.join(self.state, *parts)

    def a_run_id(self) -> str:
        return str(self.a_runs[-1]["run_id"]) if self.a_runs else "0123456789ab"

    def naming_a(self) -> dict[str, Any]:
        """A valid-looking record that names A's last run."""
        last = self.a_runs[-1] if self.a_runs else {}
        return {"run_id": self.a_run_id(), "label": last.get("label") or "a's", "uid": self.a_uid,
                "user": self.w.a, "pid": 1, "pid_start": 1, "keeper": 1, "keeper_start": 1, "cmd": 1,
                "cmd_start": 1, "phase": "running", "cls": "shared", "since": time.time() - 5,
                "outcome": self.rnd.choice(["passed", "failed"]), "exit_code": self.rnd.choice([0, 1, 3]),
                "phases": {"submitted": time.time() - 9, "slot": time.time() - 8, "started": time.time() - 8,
                           "ended": time.time() - 1}}


BOUNDARY = ["0", "-1", "999999999999999999", "1000000000000000000", "18446744073709551616", "9" * 400, "1e308",
            "NaN", " ", "\x00" * 8]


def garbage(rnd: random.Random, n: int = 512) -> str:
    return "".join(chr(rnd.randrange(1, 0x2FF)) for _ in range(n))


# ---------------------------------------------------------------- the kinds and their mutations
# Each: (kind, mutation) -> (acts for B, what the victim may have to wait: "ticket" when B holds places
# ahead of A's runs, "slot" when B holds a slot by hand for SLOT_HOLD_S; acts to do while A's run runs).

Case = tuple[Acts, set[str], Acts]


def counter(m: str, c: Ctx) -> Case:
    seq = c.path("seq")
    table: dict[str, Acts] = {
        "garbage": [{"op": "write", "path": seq, "data": garbage(c.rnd)}],
        "empty": [{"op": "write", "path": seq, "data": ""}],
        "boundary": [{"op": "write", "path": seq, "data": c.rnd.choice(BOUNDARY) + "\n"}],
        "huge": [{"op": "write", "path": seq, "data": "9" * (1 << 20)}],
        "sparse": [{"op": "sparse", "path": seq, "size": 256 << 20}],
        "lock": [{"op": "lock", "path": seq, "tag": "case"}],
        "time": [{"op": "utime", "path": seq, "t": c.rnd.choice([0, 4e9])}],
    }
    return table[m], set(), []


def names(m: str, c: Ctx) -> Case:
    pdir = c.path("tickets", c.rnd.choice(["shared", "landing"]))
    low = c.rnd.randrange(1, 10**9)
    name = os.path.join(pdir, "%016d.t" % low)
    table: dict[str, Acts] = {
        "flood": [{"op": "flood", "dir": pdir, "pattern": "%016d.t", "start": low, "n": 2000}],
        "boundary": [{"op": "write", "path": os.path.join(pdir, n), "data": ""}
                     for n in ("999999999999999999.t", "0000000000000000.t", "1.t", "-1.t", "99999999999999999999.t")],
        "link": [{"op": "symlink", "target": c.rnd.choice(["/etc/passwd", c.path("slots", "shared.0"), pdir]),
                  "path": name}],
        "fifo": [{"op": "mkfifo", "path": name}],
        "hardlink": [{"op": "hardlink", "src": c.path("slots", "shared.0"), "path": name}],
        "dir": [{"op": "mkdir", "path": name}],
        "temp": [{"op": "write", "path": os.path.join(pdir, ".%016d.1.ab.tmp" % low), "data": garbage(c.rnd)}],
        "time": [{"op": "write", "path": name, "data": json.dumps(c.naming_a())},
                 {"op": "utime", "path": name, "t": c.rnd.choice([0, 4e9])}],
    }
    return table[m], set(), []


def tickets(m: str, c: Ctx) -> Case:
    pool = c.rnd.choice(["shared", "landing"])
    pdir, seq = c.path("tickets", pool), c.path("seq")
    content = {
        "garbage": garbage(c.rnd), "empty": "", "naming_a": json.dumps(c.naming_a()),
        "huge": json.dumps({"label": "y" * 70000}),
    }
    if m == "stopped_run":
        return [{"op": "run_stopped", "pdir": c.path("tickets", "shared"), "tag": "case"}], {"ticket"}, []
    if m == "chain":
        return ([{"op": "tickets", "pdir": pdir, "seq_path": seq, "n": c.rnd.choice([2, 5, 12]),
                  "content": content[c.rnd.choice(list(content))], "tag": "case"}], {"ticket"}, [])
    if m in ("low", "last"):
        return ([{"op": "tickets", "pdir": pdir, "seq_path": seq, "n": 1, "content": json.dumps(c.naming_a()),
                  "tag": "case", "number": m, "counter": False}], {"ticket"}, [])
    return ([{"op": "tickets", "pdir": pdir, "seq_path": seq, "n": 1, "content": content[m], "tag": "case"}],
            {"ticket"}, [])


def free_slot(m: str, c: Ctx) -> Case:
    slot = c.path("slots", c.rnd.choice(["shared.0", "landing.0"]))
    record = {
        "garbage": garbage(c.rnd), "empty": "", "huge": json.dumps({"label": "z" * 70000}),
        "naming_a": json.dumps(dict(c.naming_a(), pid="$PID")),
        "naming_a_orphan": json.dumps(dict(c.naming_a(), pid=2**22 + 7)),
        "boundary": json.dumps(dict(c.naming_a(), pid=int(c.rnd.choice(["0", "-1", "2147483648", "1"])),
                                    budget=float("1e308"), since=-1)),
    }[m]
    return [{"op": "slot", "path": slot, "record": record, "tag": "slot"}], {"slot"}, []


def held_slot(m: str, c: Ctx) -> Case:
    """Written into the slot A's running run holds (B may write any slot
    file: only the lock says who holds it)."""
    slot = c.path("slots", "shared.0")
    record = {
        "orphan": json.dumps(dict(c.naming_a(), run_id="$RUN", pid_start=1, keeper_start=1, cmd_start=1)),
        "garbage": garbage(c.rnd), "huge": "[" * 70000,
        "others": json.dumps(dict(c.naming_a(), run_id="$RUN", uid=c.b_uid, label="b's now", pid=1)),
    }[m]
    return [], set(), [{"op": "write", "path": slot, "data": record, "how": "pwrite"}]


def history(m: str, c: Ctx) -> Case:
    own = c.path("history", f"u{c.b_uid}.jsonl")
    shared = c.path("history.jsonl")
    target = c.rnd.choice([own, shared])
    line = json.dumps(dict(c.naming_a(), uid=c.rnd.choice([c.a_uid, c.b_uid]), outcome="passed", exit_code=0))
    hdir = c.path("history")
    table: dict[str, Acts] = {
        "naming_a": [{"op": "write", "path": target, "data": line + "\n", "how": "append"}],
        "naming_a_dated": [{"op": "write", "path": own, "data": line + "\n", "how": "append"},
                           {"op": "utime", "path": own, "t": c.rnd.choice([0, 4e9])}],
        "garbage": [{"op": "write", "path": target, "data": garbage(c.rnd) + "\n", "how": "append"}],
        "huge_line": [{"op": "write", "path": target, "data": "{\"label\": \"" + "x" * (1 << 20) + "\"}\n",
                       "how": "append"}],
        "sparse": [{"op": "sparse", "path": os.path.join(hdir, f"u{c.b_uid}-20260101T0000{i:02d}-{i:08x}.jsonl"),
                    "size": 256 << 20} for i in range(3)],
        "flood": [{"op": "flood", "dir": hdir, "pattern": "junk%06d", "start": c.rnd.randrange(10**5), "n": 3000}],
        "claiming_a": [{"op": "flood", "dir": hdir, "pattern": f"u{c.a_uid}-20260101T000000-%08x.jsonl",
                        "start": c.rnd.randrange(10**6), "n": 500}],
        "segment_as_a": [{"op": "write", "path": os.path.join(hdir, f"u{c.a_uid}-20990101T000000-0000beef.jsonl"),
                          "data": line + "\n"}],
        "link": [{"op": "symlink", "target": "/etc/passwd", "path": os.path.join(hdir, f"u{c.b_uid}.0123456789abcdef.jsonl")}],
        "fifo": [{"op": "mkfifo", "path": os.path.join(hdir, f"u{c.b_uid}-20260101T000000-{c.rnd.randrange(10**6):08x}.jsonl")}],
    }
    return table[m], set(), []


def caches(m: str, c: Ctx) -> Case:
    """Names a user's own caches took in the state dir: taken first by B."""
    name = c.path(c.rnd.choice([f".host-config.cache.{c.a_uid}", f".line-view.shared.{c.a_uid}",
                                f".passed.shared.{c.a_uid}", f".host-config.cache.{c.b_uid}"]))
    table: dict[str, Acts] = {
        "file": [{"op": "write", "path": name, "data": c.rnd.choice(["", garbage(c.rnd), "[" * 64])}],
        "link": [{"op": "symlink", "target": str(c.w.home(c.w.a) / "precious"), "path": name}],
        "fifo": [{"op": "mkfifo", "path": name}],
        "work_dir": [{"op": "mkdir", "path": c.path("work", str(c.a_uid))}],
    }
    return table[m], set(), []


def owner_files(m: str, c: Ctx) -> Case:
    """Names only the pool's owner writes -- a pool's drain, the state
    dir's layout (host/drain.py, host/layout.py) -- taken first by B: none
    stops, delays or refuses A's runs (root's layout, made by `host init`,
    B cannot touch at all)."""
    drain = c.path(f"drain.{c.rnd.choice(['shared', 'landing'])}")
    layout = c.path("layout")
    table: dict[str, Acts] = {
        "drain": [{"op": "write", "path": c.path(f"drain.{pool}"),
                   "data": json.dumps({"since": time.time(), "reason": "b says stop"})} for pool in ("shared", "landing")],
        "drain_garbage": [{"op": "write", "path": drain, "data": c.rnd.choice(["", garbage(c.rnd), "[" * 70000])}],
        "drain_link": [{"op": "symlink", "target": c.rnd.choice(["/etc/passwd", layout]), "path": drain}],
        "drain_fifo": [{"op": "mkfifo", "path": drain}],
        "drain_dir": [{"op": "mkdir", "path": drain}],
        "layout": [{"op": "write", "path": layout, "data": c.rnd.choice(["9\n", "", garbage(c.rnd), "9" * 400])}],
    }
    return table[m], set(), []


KINDS: dict[str, tuple[Callable[[str, Ctx], Case], list[str]]] = {
    "counter": (counter, ["garbage", "empty", "boundary", "huge", "sparse", "lock", "time"]),
    "ticket_names": (names, ["flood", "boundary", "link", "fifo", "hardlink", "dir", "temp", "time"]),
    "b_tickets": (tickets, ["garbage", "empty", "naming_a", "huge", "chain", "low", "last", "stopped_run"]),
    "free_slot": (free_slot, ["garbage", "empty", "huge", "naming_a", "naming_a_orphan", "boundary"]),
    "held_slot_record": (held_slot, ["orphan", "garbage", "huge", "others"]),
    "history": (history, ["naming_a", "naming_a_dated", "garbage", "huge_line", "sparse", "flood", "claiming_a",
                          "segment_as_a", "link", "fifo"]),
    "caches": (caches, ["file", "link", "fifo", "work_dir"]),
    "owner_files": (owner_files, ["drain", "drain_garbage", "drain_link", "drain_fifo", "drain_dir", "layout"]),
}


def cases(rnd: random.Random, how_many: str) -> list[list[tuple[str, str]]]:
    """The cases: each one (kind, mutation) pair or several at once."""
    pairs = [(k, m) for k, (_, ms) in KINDS.items() for m in ms]
    rnd.shuffle(pairs)
    if how_many == "all":
        chosen = pairs
    else:
        chosen = pairs[:int(how_many)]
    out: list[list[tuple[str, str]]] = []
    i = 0
    while i < len(chosen):
        n = rnd.choice([1, 1, 1, 2, 3])  # several at once, now and then
        out.append(chosen[i:i + n])
        i += n
    return out


# ---------------------------------------------------------------- B's hands

class Hands:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import threading

        self.proc = proc
        self.lock = threading.Lock()

    def act(self, act: dict[str, Any], ctx_run: str | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = json.dumps(act)
        if ctx_run is not None:
            line = line.replace("$RUN", ctx_run)
        with self.lock:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        assert answer, "B's agent died"
        return dict(json.loads(answer))


@contextmanager
def hands(w: World) -> Iterator[Hands]:
    import pwd

    script = w.root / "hostile_agent.py"
    shutil.copy(AGENT, script)
    script.chmod(0o644)
    pw = pwd.getpwnam(w.b)
    proc = subprocess.Popen([PY, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=w.env(w.b), cwd=w.home(w.b), user=pw.pw_uid, group=pw.pw_gid,
                            extra_groups=[w.gid], umask=0o002)
    try:
        assert proc.stdout is not None and json.loads(proc.stdout.readline())["ready"]
        yield Hands(proc)
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- A's side

def _timed(w: World, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = w.run(w.a, *args, timeout=60)
    return proc, time.monotonic() - start


def _slot_run_id(w: World, label: str) -> str | None:
    """The run id in shared#0's record, once it is the run labelled so."""
    try:
        record = json.loads((w.state / "slots" / "shared.0").read_bytes()[:65536])
        return str(record["run_id"]) if record.get("label") == label else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def check_victim(w: World, b: Hands, c: Ctx, n: int, waits: set[str], during: Acts, why: str) -> list[str]:
    """A's two runs, started in order, and its status and history: what
    broke of the invariants (empty: nothing)."""
    problems: list[str] = []
    order = w.home(w.a) / "order"
    codes = [c.rnd.choice([0, 3]), c.rnd.choice([0, 5])]
    bound = 4.0 + (CLAIM_BOUND if "ticket" in waits else 0.0) + (SLOT_HOLD_S if "slot" in waits else 0.0)
    runs = []
    for k, code in enumerate(codes):
        label = f"a-{n}-{k}"
        out = w.home(w.a) / f"r{n}-{k}.json"
        p = w.popen(w.a, "run", "-q", "--label", label, "--json", str(out), "--", "sh", "-c",
                    f"sleep 0.3; echo {n}-{k} >> {order}; exit {code}")
        runs.append((p, out, code, label, time.time()))
        if k == 0:  # the second joins the line once the first is in it (or done)
            end = time.monotonic() + 10
            while time.monotonic() < end and p.poll() is None and not _in_line_or_running(w, label):
                time.sleep(0.01)  # sleep-ok: bounded wait for A's first run to show
    if during:
        end = time.monotonic() + 10
        while time.monotonic() < end and _slot_run_id(w, runs[0][3]) is None:
            time.sleep(0.01)  # sleep-ok: bounded wait for A's run to hold the slot
        for act in during:
            b.act(act, ctx_run=_slot_run_id(w, runs[0][3]) or c.a_run_id())
    for p, out, code, label, submitted in runs:
        try:
            rc = p.wait(timeout=bound + 30)
        except subprocess.TimeoutExpired:
            problems.append(f"A's run {label} did not end within {bound + 30:.0f} s ({why}); the line then: "
                            + w.run(w.a, "status").stdout[-3000:])
            p.kill()
            continue
        if rc != code:
            problems.append(f"A's run {label} exited {rc}, its command {code} ({why})")
            continue
        rec = json.loads(out.read_text())
        c.a_runs.append(rec)
        want = "passed" if code == 0 else "failed"
        if rec["outcome"] != want or rec["command_exit_code"] != code:
            problems.append(f"A's run {label} reported {rec['outcome']} ({rec['command_exit_code']}), "
                            f"its command did {code} ({why})")
        waited = float(rec["phases"]["started"]) - submitted
        if waited > bound:
            problems.append(f"A's run {label} started {waited:.1f} s after it was asked for, the bound "
                            f"{bound:.1f} s ({why})")
        attach = w.run(w.a, "attach", str(rec["run_id"]), timeout=60)
        if attach.returncode != code:
            problems.append(f"attach of A's finished run {label} says exit {attach.returncode}, its command "
                            f"{code} ({why}): {attach.stderr.strip()[-300:]}")
    lines = order.read_text().split() if order.exists() else []
    if lines[-2:] != [f"{n}-0", f"{n}-1"]:
        problems.append(f"A's runs ran out of order or not at all: {lines[-4:]} ({why})")
    for args in (("status", "--json"), ("history", "--json")):
        proc, took = _timed(w, *args)
        if proc.returncode != 0 or took > ANSWER_S:
            problems.append(f"`slotq {' '.join(args)}` took {took:.2f} s, exit {proc.returncode} ({why}): "
                            f"{proc.stderr.strip()[-300:]}")
    return problems


def _in_line_or_running(w: World, label: str) -> bool:
    for p in (w.state / "tickets" / "shared").glob("*.t"):
        try:
            if p.stat().st_uid == w.uid(w.a) and label in p.read_text()[:65536]:
                return True
        except OSError:
            continue
    return label in ((w.state / "slots" / "shared.0").read_text(errors="replace")[:65536]
                     if (w.state / "slots" / "shared.0").exists() else "")


@pytest.mark.timeout(900)
def test_a_generated_hostile_member_breaks_none_of_the_victims_invariants(world: World) -> None:
    w = world
    seed = int(os.environ.get("SLOTQ_HOSTILE_SEED") or random.randrange(1 << 32))
    how_many = os.environ.get("SLOTQ_HOSTILE_CASES", "24")
    rnd = random.Random(seed)
    c = Ctx(w, rnd)
    (w.home(w.a) / "precious").write_text("do not lose\n")
    os.chown(w.home(w.a) / "precious", w.uid(w.a), -1)
    assert w.run(w.a, "run", "-q", "--", "true").returncode == 0  # the pool's files made
    assert w.run(w.a, "run", "-q", "--class", "landing", "--", "true").returncode == 0
    played: list[str] = []
    with hands(w) as b:
        for n, combo in enumerate(cases(rnd, how_many)):
            why = " + ".join(f"{k}/{m}" for k, m in combo)
            played.append(why)
            waits: set[str] = set()
            during: Acts = []
            for kind, mutation in combo:
                acts, wait, later = KINDS[kind][0](mutation, c)
                for act in acts:
                    b.act(act)
                waits |= wait
                during += later
            problems = check_victim(w, b, c, n, waits, during, why) if "slot" not in waits else \
                _with_slot_let_go(w, b, c, n, waits, during, why, time.monotonic() + SLOT_HOLD_S)
            b.act({"op": "release_all"})
            assert not problems, f"seed {seed} (SLOTQ_HOSTILE_SEED={seed}), case {n}: " + "; ".join(problems)
    assert (w.home(w.a) / "precious").read_text() == "do not lose\n", f"seed {seed}"
    print(f"hostile: seed {seed}, {len(played)} cases: {', '.join(played)}")


def _with_slot_let_go(w: World, b: Hands, c: Ctx, n: int, waits: set[str], during: Acts, why: str,
                      let_go: float) -> list[str]:
    """A slot B took by hand is B's to hold (status names it): let go after
    SLOT_HOLD_S, while A's runs wait for it."""
    import threading

    def release() -> None:
        time.sleep(max(0.0, let_go - time.monotonic()))  # sleep-ok: B holds the slot this long, on purpose
        b.act({"op": "release", "tag": "slot"})

    t = threading.Thread(target=release)
    t.start()
    try:
        return check_victim(w, b, c, n, waits, during, why)
    finally:
        t.join()
