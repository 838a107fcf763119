"""Remote runs over OpenSSH (`--only remote`), side by side with what a
user would do by hand over the same warm master connection.

  small tree   `slotq run -q --host H -- true` in a one-file work tree
               against raw `ssh H <remote python> -c pass` + raw
               `rsync -a --delete` of the same tree. Target: <= 1.2x.
  large tree   20,000 files / 200 MB plus 5,000 .gitignore'd build files;
               one file changed: slotq's transfer phase (`transfer_s`)
               against raw `rsync -a --delete` of the same change. Target
               <= 1.2x. Then every build file changed (ignored): slotq's
               transfer must cost no more than with nothing changed.

The host is $SLOTQ_TEST_SSH_CONFIG's `slotq-test` if set, else a test sshd
this module starts with scripts/sshd-test-server (root) and stops.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tools import SLOTQ

ROOT = Path(__file__).resolve().parent.parent
HOST = "slotq-test"
REMOTE_PY = "/home/slotqtest/venv/bin/python"


@contextmanager
def sshd() -> Iterator[str]:
    cfg = os.environ.get("SLOTQ_TEST_SSH_CONFIG")
    if cfg and os.path.exists(cfg):
        yield cfg
        return
    if os.geteuid() != 0:
        raise SystemExit("remote benchmark: set SLOTQ_TEST_SSH_CONFIG, or run as root for a test sshd")
    d = tempfile.mkdtemp(prefix="slotq-bench-sshd-")
    try:
        subprocess.run([str(ROOT / "scripts" / "sshd-test-server"), "start", d], check=True, capture_output=True)
        yield os.path.join(d, "ssh_config")
    finally:
        subprocess.run([str(ROOT / "scripts" / "sshd-test-server"), "stop", d], check=False, capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def _ms(argv: list[str], **kw: object) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                   check=True, **kw)  # type: ignore[call-overload]
    return (time.perf_counter() - t0) * 1000


def run(reps: int = 15, large: bool = True) -> dict[str, object]:
    out: dict[str, object] = {"reps": reps}
    with sshd() as cfg:
        work = Path(tempfile.mkdtemp(prefix="slotq-bench-remote-"))
        runtime = work / "runtime"
        runtime.mkdir(mode=0o700)
        tag = uuid.uuid4().hex[:8]
        env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), SLOTQ_LEDGER=str(work / "ledger.sqlite"))
        remote_slotq = f"SLOTQ_STATE_DIR=$HOME/st-bench-{tag} /home/slotqtest/venv/bin/slotq"
        slotq = [SLOTQ, "run", "-q", "--host", HOST, "--ssh-config", cfg, "--remote-slotq", remote_slotq]
        try:
            small = work / "small"
            small.mkdir()
            (small / "f.txt").write_text("hello\n")
            _ms([*slotq, "--", "true"], cwd=small, env=env)  # the master and the handshake
            control = next(p for p in (runtime / "slotq-ssh").iterdir() if p.suffix == "" and p.is_socket())
            ssh = ["ssh", "-F", cfg, "-o", f"ControlPath={control}", "-o", "ControlMaster=no"]
            rsync = ["rsync", "-a", "--delete", "-e", " ".join(ssh)]
            raw, ours = [], []
            for _ in range(reps):
                a = _ms([*ssh, "-T", HOST, f"{REMOTE_PY} -c pass"])
                b = _ms([*rsync, "./", f"{HOST}:bench-raw-{tag}/"], cwd=small)
                raw.append(a + b)
                ours.append(_ms([*slotq, "--", "true"], cwd=small, env=env))
            out.update(small_raw_ms=round(statistics.median(raw), 1), small_slotq_ms=round(statistics.median(ours), 1))
            if large:
                out.update(_large(work, slotq, rsync, env, tag, max(3, reps // 3)))
        finally:
            subprocess.run(["ssh", "-F", cfg, HOST, f"rm -rf $HOME/st-bench-{tag} $HOME/bench-raw-{tag} $HOME/bench-raw-{tag}-*"],
                           capture_output=True)
            for sock in (runtime / "slotq-ssh").glob("*"):
                if sock.suffix == "" and sock.is_socket():
                    subprocess.run(["ssh", "-F", cfg, "-o", f"ControlPath={sock}", "-O", "exit", HOST],
                                   capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    print(f"remote: {out}", file=sys.stderr)
    return out


def _large(work: Path, slotq: list[str], rsync: list[str], env: dict[str, str], tag: str,
           reps: int) -> dict[str, object]:
    tree = work / "large"
    blob = os.urandom(10_000)
    for d in range(200):
        sub = tree / "src" / f"d{d:03d}"
        sub.mkdir(parents=True)
        for f in range(100):
            (sub / f"f{f:03d}.py").write_bytes(blob[f:] + blob[:f])
    build = tree / "build"
    for d in range(50):
        (build / f"o{d}").mkdir(parents=True)
        for f in range(100):
            (build / f"o{d}" / f"x{f}.o").write_bytes(b"o" * 100)
    (tree / ".gitignore").write_text("build/\n")
    dest = f"{os.uname().nodename}-large"

    def transfer() -> float:
        proc = subprocess.run([*slotq, "--json", "-", "--", "true"], cwd=tree, env=env, capture_output=True,
                              text=True, check=True, stdin=subprocess.DEVNULL)
        return float(json.loads(proc.stdout[proc.stdout.index("{"):])["transfer_s"]) * 1000

    transfer()  # the first copy, untimed
    _ms([*rsync, "--filter=:- .gitignore", "./", f"{HOST}:bench-raw-{tag}-{dest}/"], cwd=tree)
    ours, raw, ignored, unchanged = [], [], [], []
    for i in range(reps):
        target = tree / "src" / f"d{i:03d}" / "f000.py"
        target.write_bytes(os.urandom(10_000))
        ours.append(transfer())
        raw.append(_ms([*rsync, "--filter=:- .gitignore", "./", f"{HOST}:bench-raw-{tag}-{dest}/"], cwd=tree))
        unchanged.append(transfer())
        for obj in (build / "o0").iterdir():
            obj.write_bytes(os.urandom(100))
        ignored.append(transfer())
    return {"large_files": 20_000, "large_mb": 200, "large_slotq_ms": round(statistics.median(ours), 1),
            "large_raw_ms": round(statistics.median(raw), 1),
            "large_unchanged_ms": round(statistics.median(unchanged), 1),
            "large_ignored_changed_ms": round(statistics.median(ignored), 1)}


def format_remote(r: dict[str, object]) -> list[str]:
    lines = [f"remote (loopback sshd, warm master, medians of {r['reps']} paired runs):",
             "| scenario | slotq | raw | slotq / raw |", "|---|---|---|---|",
             f"| one-file tree: `slotq run -q --host H -- true` vs ssh + python + rsync | {r['small_slotq_ms']} ms "
             f"| {r['small_raw_ms']} ms | {float(r['small_slotq_ms']) / float(r['small_raw_ms']):.2f}x |"]  # type: ignore[arg-type]
    if "large_slotq_ms" in r:
        lines.append(f"| 20,000 files / 200 MB, one changed: transfer phase vs raw rsync | {r['large_slotq_ms']} ms "
                     f"| {r['large_raw_ms']} ms | "
                     f"{float(r['large_slotq_ms']) / float(r['large_raw_ms']):.2f}x |")  # type: ignore[arg-type]
        lines.append(f"| the same, nothing changed / 100 ignored build files changed | {r['large_unchanged_ms']} ms / "
                     f"{r['large_ignored_changed_ms']} ms | – | – |")
    return lines


def targets(r: dict[str, object]) -> list[tuple[str, bool, str]]:
    s, raw = float(r["small_slotq_ms"]), float(r["small_raw_ms"])  # type: ignore[arg-type]
    out = [("remote run within 1.2x raw ssh + python + rsync", s <= 1.2 * raw,
            f"slotq {s:.0f} ms vs raw {raw:.0f} ms ({s / raw:.2f}x)")]
    if "large_slotq_ms" in r:
        lt, lr = float(r["large_slotq_ms"]), float(r["large_raw_ms"])  # type: ignore[arg-type]
        out.append(("large tree transfer within 1.2x raw rsync", lt <= 1.2 * lr,
                    f"slotq {lt:.0f} ms vs rsync {lr:.0f} ms ({lt / lr:.2f}x)"))
        un, ig = float(r["large_unchanged_ms"]), float(r["large_ignored_changed_ms"])  # type: ignore[arg-type]
        out.append(("ignored build output costs nothing", ig <= 1.2 * un,
                    f"{ig:.0f} ms with changed build files vs {un:.0f} ms unchanged"))
    return out
