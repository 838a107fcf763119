"""The Slurm figures of benchmarks/run (`--only slurm`): slotq on Slurm
against raw Slurm, side by side, repetition by repetition.

  submit -> start   uncontended: from launching the client to the command's
                    first instruction (it stamps the time). Raw: `srun`;
                    slotq: `slotq run --slurm`. Target: slotq <= raw + 0.3 s.
  hand-over         job A holds both CPUs and stamps its end; job B waits
                    behind it and stamps its start: B's start - A's end.
                    Raw: both `sbatch`; slotq: both `slotq run --slurm`.
                    Target: slotq <= 1.2x raw.

The cluster is $SLURM_CONF if set, else a private one that this module
starts with scripts/slurm-test-cluster (root) and stops afterwards.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tools import SLOTQ

ROOT = Path(__file__).resolve().parent.parent
STAMP = "date +%s%N"


@contextmanager
def cluster() -> Iterator[dict[str, str]]:
    """The environment for a Slurm cluster: the caller's, or a private one."""
    if os.environ.get("SLURM_CONF"):
        yield dict(os.environ)
        return
    if os.geteuid() != 0:
        raise SystemExit("slurm benchmark: set SLURM_CONF, or run as root for a private cluster")
    d = tempfile.mkdtemp(prefix="slotq-bench-slurm-")
    try:
        out = subprocess.run([str(ROOT / "scripts" / "slurm-test-cluster"), "start", d], capture_output=True,
                             text=True, check=True).stdout
        conf = out.strip().split("export SLURM_CONF=", 1)[1].split()[0]
        yield dict(os.environ, SLURM_CONF=conf)
    finally:
        subprocess.run([str(ROOT / "scripts" / "slurm-test-cluster"), "stop", d], check=False)
        shutil.rmtree(d, ignore_errors=True)


def _stamp(path: Path, timeout: float = 60) -> int:
    end = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        if time.monotonic() > end:
            raise TimeoutError(f"no stamp in {path}")
        time.sleep(0.002)


def submit_to_start(env: dict[str, str], work: Path, tool: str) -> float:
    """ms from launching the client to the command's start."""
    stamp = work / f"start-{tool}-{time.monotonic_ns()}"
    cmd = ["sh", "-c", f"{STAMP} > {stamp}"]
    argv = (["srun", "--quiet", *cmd] if tool == "srun"
            else [SLOTQ, "run", "-q", "--slurm", "--", *cmd])
    t0 = time.time_ns()
    subprocess.run(argv, env=env, cwd=work, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return (_stamp(stamp) - t0) / 1e6


def handover(env: dict[str, str], work: Path, tool: str, hold_s: float = 2.0) -> float:
    """ms from job A's end to job B's start, B waiting behind A."""
    tag = f"{tool}-{time.monotonic_ns()}"
    a_end, b_start = work / f"a-end-{tag}", work / f"b-start-{tag}"
    a_cmd = f"sleep {hold_s}; {STAMP} > {a_end}"
    b_cmd = f"{STAMP} > {b_start}"
    procs = []
    if tool == "sbatch":
        for script in (a_cmd, b_cmd):
            subprocess.run(["sbatch", "--parsable", "-c2", "-o", "/dev/null", "--wrap", script], env=env, cwd=work,
                           check=True, capture_output=True)
    else:
        for script in (a_cmd, b_cmd):
            procs.append(subprocess.Popen([SLOTQ, "run", "-q", "--slurm", "--slurm-option=-c2", "--", "sh", "-c",
                                           script], env=env, cwd=work, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL))
            if not procs[1:]:
                _wait_running(env)  # A holds the CPUs before B is submitted, as with sbatch's order
    gap = (_stamp(b_start) - _stamp(a_end)) / 1e6
    for p in procs:
        p.wait(timeout=60)
    _wait_idle(env)
    return gap


def _squeue(env: dict[str, str], *args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], env=env, capture_output=True, text=True).stdout


def _wait_running(env: dict[str, str]) -> None:
    end = time.monotonic() + 30
    while "R" not in _squeue(env, "-o", "%t").split() and time.monotonic() < end:
        time.sleep(0.005)


def _wait_idle(env: dict[str, str]) -> None:
    end = time.monotonic() + 60
    while _squeue(env, "-o", "%i").strip() and time.monotonic() < end:
        time.sleep(0.02)


def run(reps: int) -> dict[str, object]:
    with cluster() as env:
        work = Path(tempfile.mkdtemp(prefix="slotq-bench-slurmwork-"))
        env = dict(env, SLOTQ_STATE_DIR=str(work / "state"), SLOTQ_LEDGER=str(work / "ledger.sqlite"))
        env.pop("SLOTQ_CONFIG", None)
        try:
            for tool in ("srun", "slotq"):  # warm both (page cache, munge)
                submit_to_start(env, work, tool)
            start: dict[str, list[float]] = {"srun": [], "slotq": []}
            hand: dict[str, list[float]] = {"sbatch": [], "slotq": []}
            for _ in range(reps * 3):
                for tool in start:
                    start[tool].append(submit_to_start(env, work, tool))
            for _ in range(reps):
                for tool in hand:
                    hand[tool].append(handover(env, work, tool))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out: dict[str, object] = {"reps": reps}
    for name, samples in (("start", start), ("handover", hand)):
        for tool, xs in samples.items():
            out[f"{name}_{tool}_ms"] = round(statistics.median(xs), 1)
            out[f"{name}_{tool}_range"] = [round(min(xs), 1), round(max(xs), 1)]
    print(f"slurm: {out}", file=sys.stderr)
    return out


def _num(r: dict[str, object], key: str) -> float:
    v = r[key]
    assert isinstance(v, (int, float))
    return float(v)


def format_slurm(r: dict[str, object]) -> list[str]:
    def ms(key: str) -> float:
        return _num(r, key)

    def rng(key: str) -> str:
        v = r[key]
        assert isinstance(v, list)
        return f"[{v[0]:.0f}–{v[1]:.0f}]"

    return [f"slurm (one-node test cluster, {r['reps']} reps; submit→start {3 * int(ms('reps'))} reps), "
            "ms, medians [min–max]:",
            "| scenario | slotq --slurm | raw Slurm | difference |",
            "|---|---|---|---|",
            f"| submit → command start, uncontended | {ms('start_slotq_ms'):.0f} {rng('start_slotq_range')} | "
            f"srun {ms('start_srun_ms'):.0f} {rng('start_srun_range')} | "
            f"+{ms('start_slotq_ms') - ms('start_srun_ms'):.0f} ms |",
            f"| hand-over: A's end → B's start | {ms('handover_slotq_ms'):.0f} {rng('handover_slotq_range')} | "
            f"sbatch {ms('handover_sbatch_ms'):.0f} {rng('handover_sbatch_range')} | "
            f"{ms('handover_slotq_ms') / max(ms('handover_sbatch_ms'), 0.001):.2f}x |"]


def targets(r: dict[str, object]) -> list[tuple[str, bool, str]]:
    s, raw = _num(r, "start_slotq_ms"), _num(r, "start_srun_ms")
    h, hb = _num(r, "handover_slotq_ms"), _num(r, "handover_sbatch_ms")
    return [("slurm submit → start within raw srun + 300 ms", s <= raw + 300,
             f"slotq {s:.0f} ms vs srun {raw:.0f} ms (+{s - raw:.0f} ms)"),
            ("slurm hand-over within 1.2x raw sbatch", h <= 1.2 * hb,
             f"slotq {h:.0f} ms vs sbatch {hb:.0f} ms ({h / max(hb, 0.001):.2f}x)")]
