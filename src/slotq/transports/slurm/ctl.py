"""What Slurm's own client tools say, asked with limits: `sbatch` (submit),
`squeue` and `sinfo` (a pending job's place, a partition's queue),
`scontrol` and `sacct` (how a job ended). Used by the Slurm transport
(this package) and by `slotq status --slurm`. Every tool has a timeout, and
its output is read only so far; a failure is HostUnavailable in the tool's
own words (job_info: {} instead)."""

from __future__ import annotations

import subprocess

from ...errors import HostUnavailable


def _run(argv: list[str], env: dict[str, str] | None, timeout: float) -> subprocess.CompletedProcess[str]:
    """One of Slurm's tools, its output as text. Slurm passes job names,
    commands and work dirs on as the bytes it was given, and anyone may
    submit a job: what is not UTF-8 is replaced, never a decoding error."""
    return subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace", timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def submit(args: list[str], script: str, env: dict[str, str] | None = None) -> str:
    """Submit a batch job (`sbatch --parsable ARGS --wrap SCRIPT`); its id.
    Raises HostUnavailable with sbatch's own words when it refuses."""
    try:
        proc = _run(["sbatch", "--parsable", *args, "--wrap", script], env, 60)
    except FileNotFoundError:
        raise HostUnavailable("sbatch is not installed here (Slurm's client tools)", host="slurm") from None
    except subprocess.TimeoutExpired:
        raise HostUnavailable("sbatch did not answer within 60 s (slurmctld down?)", host="slurm") from None
    job = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job.isdigit():
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise HostUnavailable(f"Slurm refused the job: {why}", host="slurm")
    return job


MAX_LINES = 10_000  # squeue output read at most this far (a huge queue is cut, never unbounded)
QUERY_TIMEOUT = 30.0  # seconds a query tool (squeue, sinfo, scancel) may take


COMMENT_BYTES = 1024  # the longest --comment Slurm takes (23.02: "Pathname ... too long")


def as_comment(label: str) -> str:
    """A run's label as its job's comment, where `run --slurm` puts it and
    `cancel --slurm --label` looks for it (the pattern made the same way):
    one line of printable text, in the bytes Slurm keeps, whole characters."""
    from ...records import printable, valid_text

    return printable(valid_text(label), 1000).encode()[:COMMENT_BYTES].decode("utf-8", "ignore")


def _comment(raw: str) -> str | None:
    return None if raw == "(null)" else raw  # squeue's word for none


def _squeue(args: list[str], env: dict[str, str] | None) -> list[list[str]]:
    """Rows of `squeue -h ARGS`, fields split on '|' (the last field, a job
    name or comment, may itself contain '|': it gets the rest of the line)."""
    out = _query(["squeue", "-h", *args], env)
    fmt = next(a for a in args if a.startswith("--format=") or a.startswith("-o"))
    n = fmt.count("|") + 1
    return [line.split("|", n - 1) for line in out.splitlines()[:MAX_LINES] if line.count("|") >= n - 1]


def _query(argv: list[str], env: dict[str, str] | None) -> str:
    """The output of one of Slurm's query tools; HostUnavailable with the
    tool's own last line when it fails or does not answer in 30 s."""
    try:
        proc = _run(argv, env, QUERY_TIMEOUT)
    except FileNotFoundError:
        raise HostUnavailable(f"{argv[0]} is not installed here (Slurm's client tools)", host="slurm") from None
    except subprocess.TimeoutExpired:
        raise HostUnavailable(f"{argv[0]} did not answer within {QUERY_TIMEOUT:g} s (slurmctld down, or no "
                              f"Slurm configuration here?)", host="slurm") from None
    except OSError as e:
        raise HostUnavailable(f"cannot run {argv[0]}: {e.strerror or e}", host="slurm") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise HostUnavailable(f"{argv[0]} failed: {why}", host="slurm")
    return proc.stdout


def pending_view(job_id: str, partition: str | None, env: dict[str, str] | None = None) -> dict[str, object]:
    """What a waiting caller is told about its pending job: its position
    among the partition's pending jobs in Slurm's priority order, Slurm's
    pending reason, the running jobs that hold the partition's resources
    (user, name, how long), and Slurm's expected start time if it has one.
    `partition` None: the job's own (Slurm's default partition)."""
    if partition is None:
        rows = _squeue(["-j", job_id, "--format=%P|%i"], env)
        partition = rows[0][0] if rows else "?"
    pending = _squeue(["-p", partition, "-t", "PD", "--sort=-p,i", "--format=%i|%r|%S|%u|%j"], env)
    running = _squeue(["-p", partition, "-t", "R", "--format=%i|%u|%M|%j"], env)
    labels = _labels(["-p", partition, "-t", "R"], running, 3, env)
    ids = [row[0] for row in pending]
    mine = pending[ids.index(job_id)] if job_id in ids else None
    start = mine[2] if mine else ""
    return {
        "job_id": job_id, "partition": partition, "state": "PENDING" if mine else "not pending",
        "position": ids.index(job_id) + 1 if mine else None, "pending": len(ids),
        "reason": mine[1] if mine else None,
        "expected_start": start if start and start not in ("N/A", "Unknown") else None,
        "holders": [{"job_id": r[0], "user": r[1], "elapsed": r[2], "name": r[3], "label": labels.get(r[0])}
                    for r in running],
    }


def partition_view(partition: str | None, env: dict[str, str] | None = None) -> dict[str, object]:
    """A partition's queue, slotq's way (`slotq status --slurm`): the
    running jobs (user, name, how long) and the pending ones in Slurm's
    priority order with Slurm's reason and expected start. `partition`
    None: Slurm's default partition."""
    where = ["-p", partition] if partition else []
    if partition is None:
        rows = _default_partition(env)
        where = ["-p", rows] if rows else []
    elif not _query(["sinfo", "-h", "-p", partition, "-o", "%P"], env).strip():
        # squeue shows an unknown partition as an empty queue: all seemed
        # well while Slurm refused every run of its classes.
        return {"partition": partition, "missing": True, "running": [], "pending": []}
    pending = _squeue([*where, "-t", "PD", "--sort=-p,i", "--format=%i|%r|%S|%u|%M|%j"], env)
    running = _squeue([*where, "-t", "R,CG", "--format=%i|%T|%u|%M|%N|%j"], env)
    labels = {**_labels([*where, "-t", "PD"], pending, 5, env), **_labels([*where, "-t", "R,CG"], running, 5, env)}
    return {
        "partition": partition or (where[1] if where else None),
        "running": [_kept({"job_id": r[0], "state": r[1], "user": r[2], "elapsed": r[3], "nodes": r[4],
                           "name": r[5], "label": labels.get(r[0])}) for r in running],
        "pending": [_kept({"position": i + 1, "job_id": r[0], "reason": r[1],
                           "expected_start": r[2] if r[2] not in ("N/A", "Unknown", "") else None, "user": r[3],
                           "name": r[5], "label": labels.get(r[0])}) for i, r in enumerate(pending)],
    }


def _kept(job: dict[str, object]) -> dict[str, object]:
    """A job of a kept run of ours (`run --slurm --detach`) says its lease,
    which its process on this machine keeps (host/kept.py)."""
    name = str(job.get("name"))
    if name.startswith("slotq-"):
        from ...host.kept import slurm_lease
        from ...spec import is_run_id

        run_id = name[6:]
        lease = slurm_lease(run_id) if is_run_id(run_id) else None
        if lease is not None:
            job["kept"] = {"lease_s": lease}
    return job


def _labels(where: list[str], rows: list[list[str]], name_at: int, env: dict[str, str] | None) -> dict[str, str]:
    """job id -> label, for slotq's jobs among `rows` (named `slotq-<run
    id>`; the name in field `name_at`): their comment, where `run --slurm`
    puts the label. Asked on its own (`%i|%k`: the comment gets the rest of
    the line), as a name and a comment on one line could each hold a `|`."""
    ours = {r[0] for r in rows if r[name_at].startswith("slotq-")}
    if not ours:
        return {}
    labels = {job: _comment(raw) for job, raw in _squeue([*where, "--format=%i|%k"], env) if job in ours}
    return {job: label for job, label in labels.items() if label is not None}


def _named(job: dict[str, object]) -> str:
    """A job as status shows it: its name (a slotq run's, `slotq-<run id>`,
    is what `slotq cancel --slurm` takes), then its label if it is ours."""
    from ...records import printable

    return printable(job["name"], 60) + (f" ({printable(job['label'], 60)})" if job.get("label") else "")


def _kept_note(job: dict[str, object]) -> str:
    kept = job.get("kept")
    if not isinstance(kept, dict):
        return ""
    from ...durations import format_duration

    return f"  [kept: its caller may be away, lease {format_duration(float(kept['lease_s']))}]"


def _default_partition(env: dict[str, str] | None) -> str:
    """The default partition's name (sinfo marks it with `*`)."""
    return next((p[:-1] for p in _query(["sinfo", "-h", "-o", "%P"], env).split()[:MAX_LINES] if p.endswith("*")),
                "")


def format_partitions(views: list[dict[str, object]]) -> str:
    """`slotq status --slurm` as text."""
    from ...records import printable

    out: list[str] = []
    for v in views:
        running = v.get("running") or []
        pending = v.get("pending") or []
        classes = ", ".join(map(str, v.get("classes") or []))  # type: ignore[call-overload]
        assert isinstance(running, list) and isinstance(pending, list)
        out.append(f"partition {printable(v.get('partition'))}" + (f" (classes {classes})" if classes else "")
                   + (": Slurm has no such partition (runs of these classes are refused)" if v.get("missing")
                      else f": {len(running)} running, {len(pending)} pending"))
        for r in running:
            out.append(f"  running   job {printable(r['job_id'])}  {printable(r['user'])}  "
                       f"{_named(r)}  for {printable(r['elapsed'])}  "
                       f"on {printable(r['nodes'])}" + _kept_note(r))
        for p in pending:
            out.append(f"  pending {p['position']:>2}. job {printable(p['job_id'])}  {printable(p['user'])}  "
                       f"{_named(p)}  reason {printable(p['reason'])}"
                       + (f"  expected {printable(p['expected_start'])}" if p["expected_start"] else "")
                       + _kept_note(p))
    return "\n".join(out) + "\n"


SlurmJob = tuple[str, int, "str | None"]  # (job id, its owner's uid: Slurm's word, its label)


def slotq_jobs(env: dict[str, str] | None = None) -> dict[str, list[SlurmJob]]:
    """run id -> [(Slurm job id, its owner's uid, its label)] for the jobs
    named `slotq-<run id>` that are pending or running: every one, since
    anyone may name a job so (a job of another user's under our run's name
    is theirs, never ours). The label is the job's comment (None if none)."""
    from ...spec import is_run_id

    rows = _squeue(["-t", "PD,CF,R,S,RQ,RS,RH", "--format=%i|%U|%j|%k"], env)
    out: dict[str, list[SlurmJob]] = {}
    for job, uid, name, comment in rows:
        run_id = name.removeprefix("slotq-")
        if name.startswith("slotq-") and is_run_id(run_id) and uid.isdigit():
            out.setdefault(run_id, []).append((job, int(uid), _comment(comment)))
    return out


def jobs_named(name: str, user: str, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(job id, node list) of `user`'s jobs named `name` that Slurm still
    knows, ended ones too; the node list is '' for a job that never ran."""
    return [(r[0], r[1]) for r in _squeue(["--states=all", "--name", name, "--user", user, "--format=%i|%N"], env)]


def cancel_jobs(jobs: list[str], env: dict[str, str] | None = None) -> None:
    """scancel these jobs; HostUnavailable with scancel's last line if it fails."""
    _query(["scancel", "--quiet", *jobs], env)


def job_info(job_id: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Slurm's facts about a job (JobState, Reason, NodeList, Partition,
    ExitCode, TimeLimit, ...) from `scontrol show job -o`; with accounting,
    sacct's State says who cancelled it ("CANCELLED by 1000"). {} when
    Slurm no longer knows the job."""
    info: dict[str, str] = {}
    try:
        proc = _run(["scontrol", "show", "job", "-o", job_id], env, 30)
        line = proc.stdout[:65536] if proc.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        line = ""
    for token in line.split():
        key, eq, value = token.partition("=")
        if eq and key in _JOB_FIELDS:
            info[key] = value
    try:
        proc = _run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], env, 30)
        state = proc.stdout.strip().splitlines()[:1] if proc.returncode == 0 else []
        if state and state[0].strip():
            info["AcctState"] = state[0].strip()[:200]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


_JOB_FIELDS = {"JobState", "Reason", "NodeList", "Partition", "ExitCode", "TimeLimit", "StartTime", "EndTime",
               "QOS", "JobName"}
