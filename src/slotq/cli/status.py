"""`slotq status`: pools, slot holders, the waiting line, load, recent runs."""

from __future__ import annotations

import json
import sys
import time

from slotq.cli.args import FLAG, Opt, Parser, host_options, positive_int

PARSER = Parser(
    prog="slotq status", usage="slotq status [--json] [--history N] [--host HOST | --slurm]",
    description="Show the host's queue: pools, slots and who holds them (phase, age, budget), waiting "
                "tickets in order with their wait so far, machine load and recent runs.",
    options=[
        Opt("--json", kind=FLAG, help="machine-readable output"),
        Opt("--history", metavar="N", convert=positive_int, default=10, help="recent runs to show (default 10)"),
        *host_options(),
        Opt("--slurm", kind=FLAG, help="the Slurm partitions the host config's [slurm.classes] name: running "
                                       "jobs, and pending ones in Slurm's priority order with its reasons"),
    ],
)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    if opts.slurm and opts.host:
        raise PARSER.error("--slurm and --host name two different places: choose one")
    if opts.slurm:
        return _slurm(opts.json)
    if opts.host:
        from slotq.transports.ssh import SshHost

        for host in [h for h in opts.host.split(",") if h]:
            remote = SshHost(host, config=opts.ssh_config, options=opts.ssh_option,
                             remote_slotq=opts.remote_slotq)
            remote.ensure_master()
            sys.stdout.write(remote.status(as_json=opts.json))
        return 0
    from slotq.config import HostConfig, state_dir_from_env
    from slotq.status import format_snapshot, snapshot

    state_dir = state_dir_from_env()
    config = HostConfig.load(state_dir=state_dir)
    snap = snapshot(state_dir, config, time.time(), opts.history)
    if opts.json:
        json.dump(snap, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_snapshot(snap))
    return 0


def _slurm(as_json: bool) -> int:
    from slotq.config import HostConfig
    from slotq.errors import HostUnavailable
    from slotq.transports.slurm import format_partitions, partition_view

    config = HostConfig.load()
    by_partition: dict[str | None, list[str]] = {}
    for cls, job in sorted(config.slurm.classes.items()):
        by_partition.setdefault(job.get("partition"), []).append(cls)
    views = []
    try:
        for partition, classes in by_partition.items():
            views.append(dict(partition_view(partition), classes=classes))
    except HostUnavailable as e:
        raise HostUnavailable(f"cannot read Slurm's queue: {e}", host="slurm") from None
    if as_json:
        json.dump({"partitions": views}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_partitions(views))
    return 0
