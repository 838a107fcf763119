"""`slotq host check`: what an operator runs after setting up or changing a
test machine. Each finding is one line: `ok   ...` or `FIX  ...: how`.
Exit 0 only when every check is ok, 1 when one needs fixing."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

from slotq.cli.args import Opt, Parser

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slotq.config import HostConfig

PARSER = Parser(
    prog="slotq host check", usage="slotq host check [--ssh-config FILE] [--remote-slotq CMD]",
    description="Check this test host: slotq's version, the state directory's layout, owners and modes, "
                "host.toml, free disk, inotify limits, drains, and the ssh hosts ([groups]) and Slurm it names. "
                "One line per finding, each problem with its fix. "
                "Exit codes: 0 all is well, 1 something to fix, 64 bad arguments.",
    options=[
        Opt("--ssh-config", metavar="FILE", help="ssh config for the hosts [groups] names"),
        Opt("--remote-slotq", metavar="CMD", default="slotq", help="slotq on those hosts (default: slotq)"),
    ],
)

EXIT_FIX = 1
MIN_FREE_BYTES = 1 << 30  # the history, the work trees synced here
# One instance per waiting run that watches; past them a run waits on locks
# in threads instead (hostqueue.Waiter): slower hand-overs, no failure.
MIN_INOTIFY_INSTANCES = 128  # the kernel's default
MIN_INOTIFY_WATCHES = 8192


class Findings:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.fixes = 0

    def ok(self, what: str) -> None:
        self.lines.append(f"ok   {what}")

    def fix(self, what: str, how: str) -> None:
        self.fixes += 1
        self.lines.append(f"FIX  {what}: {how}")


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.config import state_dir_from_env

    state_dir = state_dir_from_env()
    out = Findings()
    _version(out)
    config = _config(out, state_dir)
    if _state_dir(out, state_dir):
        _layout(out, state_dir)
        _disk(out, state_dir)
        if config is not None:
            _drains(out, state_dir, list(config.pools))
    _inotify(out)
    if config is not None:
        _ssh_hosts(out, sorted({h for hosts in config.groups.values() for h in hosts}), opts.ssh_config,
                   opts.remote_slotq)
        _slurm(out, config)
    sys.stdout.write("\n".join(out.lines) + "\n")
    return EXIT_FIX if out.fixes else 0


def _version(out: Findings) -> None:
    from slotq import __version__, protocol
    from slotq.host.layout import LAYOUT

    out.ok(f"slotq {__version__} (Python {sys.version.split()[0]}; {protocol.spoken()}; state layout {LAYOUT})")


def _config(out: Findings, state_dir: str) -> HostConfig | None:
    from slotq.config import HostConfig
    from slotq.errors import ConfigError

    try:
        config = HostConfig.load(state_dir=state_dir)
    except ConfigError as e:
        out.fix(f"host config: {e}", f"edit {e.path or 'it'} (docs/configuration.md)")
        return None
    where = config.path or "the defaults (no host.toml)"
    pools = ", ".join(f"{p} ({n} slot{'s' if n != 1 else ''})" for p, n in config.pools.items())
    out.ok(f"host config {where}: pools {pools}")
    for w in config.warnings:
        out.fix(f"host config: {w}", "fix the file it names, or remove it")
    return config


def _state_dir(out: Findings, state_dir: str) -> bool:
    from slotq.host.status import setup_problems
    from slotq.procinfo import user_name

    try:
        st = os.stat(state_dir)
    except FileNotFoundError:
        out.ok(f"state dir {state_dir} is not there yet: the first run makes it, private (for a machine "
               f"several users share: `slotq host init --shared {state_dir} --group GROUP` as root)")
        return False
    except OSError as e:
        out.fix(f"state dir {state_dir}: {e.strerror}", "check the path and its permissions")
        return False
    if not stat.S_ISDIR(st.st_mode):
        out.fix(f"state dir {state_dir} is not a directory", "remove it, or point SLOTQ_STATE_DIR elsewhere")
        return False
    shared = bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    problems = setup_problems(state_dir)
    for p in problems:
        out.fix(p, f"run `slotq host init --shared {state_dir} --group GROUP` as root")
    if not problems:
        mode = stat.filemode(st.st_mode)
        out.ok(f"state dir {state_dir}: owner {user_name(st.st_uid)}, {mode}"
               + (", shared by its group, sticky" if shared else ", private"))
    if not os.access(state_dir, os.R_OK | os.W_OK | os.X_OK):
        out.fix(f"state dir {state_dir} is not writable by you ({user_name(os.getuid())})",
                "add yourself to its group, or use a state dir of your own")
    return True


def _layout(out: Findings, state_dir: str) -> None:
    from slotq.host.layout import LAYOUT, LAYOUT_FILE, layout_of

    found = layout_of(state_dir)
    path = os.path.join(state_dir, LAYOUT_FILE)
    if found is None and os.path.lexists(path):
        out.fix(f"{path} is not the owner's (or not a number): ignored",
                f"run `slotq host init --shared {state_dir} --group GROUP` as root (it rewrites it)")
    elif found is None:
        out.ok(f"state layout: no {LAYOUT_FILE} file (made before slotq 0.2.0): layout 1")
    elif found > LAYOUT:
        out.fix(f"state layout {found} is newer than this slotq knows ({LAYOUT})", "pip install -U slotq")
    else:
        out.ok(f"state layout {found}")


def _disk(out: Findings, state_dir: str) -> None:
    usage = shutil.disk_usage(state_dir)
    free = f"{usage.free / (1 << 30):.1f} GiB free of {usage.total / (1 << 30):.1f} GiB"
    if usage.free < MIN_FREE_BYTES or usage.free < usage.total * 0.02:
        out.fix(f"disk of {state_dir}: {free}", "free space there (old work trees in work/, the history's "
                                                "retention in host.toml)")
    else:
        out.ok(f"disk of {state_dir}: {free}")


def _drains(out: Findings, state_dir: str, pools: list[str]) -> None:
    from slotq.host.drain import PREFIX, describe, owners, read
    from slotq.procinfo import user_name

    for pool in pools:
        path = os.path.join(state_dir, PREFIX + pool)
        d = read(state_dir, pool)
        if d is not None:
            out.ok(f"{describe(pool, d.as_json())} (`slotq host resume {pool}` ends it)")
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid not in owners(state_dir):
            out.fix(f"{path} is user {user_name(st.st_uid)}'s, not the owner's: no drain, and it blocks none",
                    f"remove it (as root: rm {path})")
        else:
            out.fix(f"{path} is not a drain slotq can read", f"remove it (rm {path}), then drain again")


def _inotify(out: Findings) -> None:
    for name, least in (("max_user_instances", MIN_INOTIFY_INSTANCES), ("max_user_watches", MIN_INOTIFY_WATCHES)):
        try:
            with open(f"/proc/sys/fs/inotify/{name}") as f:
                value = int(f.read().strip())
        except (OSError, ValueError):
            out.fix(f"inotify {name}: unknown", "slotq falls back to polling locks; check /proc/sys/fs/inotify")
            continue
        if value < least:
            out.fix(f"inotify {name} is {value} (waiting runs past it wait without inotify, in threads)",
                    f"sysctl -w fs.inotify.{name}={least} (and in /etc/sysctl.d/ to keep it)")
        else:
            out.ok(f"inotify {name} {value}")


def _ssh_hosts(out: Findings, hosts: list[str], ssh_config: str | None, remote_slotq: str) -> None:
    from slotq import __version__, protocol
    from slotq.errors import HostUnavailable, UsageError
    from slotq.records import printable
    from slotq.transports.ssh import SshHost

    for host in hosts:
        try:
            ssh = SshHost(host, config=ssh_config, remote_slotq=remote_slotq)
            ssh.ensure_master()
            info = ssh.hello()
        except (HostUnavailable, UsageError) as e:
            out.fix(f"host {host} ([groups]): {e}", "check `ssh HOST slotq host hello` from here")
            continue
        low, high = protocol.spoken_by(info)
        note = "" if info.get("slotq") == __version__ else f" (this one: {__version__}; they speak to each other)"
        out.ok(f"host {host} ([groups]) answers: slotq {printable(info.get('slotq'), 40)}, stream protocols "
               f"{low}-{high}{note}")


def _slurm(out: Findings, config: HostConfig) -> None:
    sinfo = shutil.which("sinfo")
    if sinfo is None or not (os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf")):
        return  # no Slurm configured here: nothing to reach
    try:
        done = subprocess.run([sinfo, "-h", "-o", "%P %a %D"], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        out.fix("Slurm: sinfo did not answer within 20 s", "check slurmctld (scontrol ping)")
        return
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
        out.fix(f"Slurm: sinfo failed: {last}", "check slurmctld and munged (scontrol ping; SLURM_CONF)")
        return
    parts = [line.split()[0] for line in done.stdout.splitlines() if line.split()]
    wanted = {job.get("partition") for job in config.slurm.classes.values() if job.get("partition")}
    missing = sorted(p for p in wanted if p is not None and p not in {q.rstrip("*") for q in parts})
    if missing:
        out.fix(f"Slurm: [slurm.classes] names partition(s) {', '.join(missing)}, which sinfo does not list",
                "fix host.toml's [slurm.classes], or the cluster")
    else:
        out.ok(f"Slurm answers: partitions {', '.join(parts) or '-'}")
