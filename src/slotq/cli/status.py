"""`slotq status`: pools, slot holders, the waiting line, load, recent runs."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable

from slotq.cli.args import (FLAG, Namespace, Opt, Parser, duration, host_options, positive_int, reader_exits,
                            use_slurm)
from slotq.errors import SlotqError

PARSER = Parser(
    prog="slotq status", usage="slotq status [--json] [--history N] [--watch [--every D]] [--host HOST | --slurm]",
    description="Show the host's queue: pools, slots and who holds them (phase, age, budget), waiting "
                "tickets in order with their wait so far and expected wait, machine load and recent runs. "
                "--watch keeps showing it: on a terminal a full-screen view redrawn in place (Ctrl-C leaves "
                "the terminal as it was); in a pipe a plain snapshot every --every.",
    epilog=reader_exits("a host (--host) or Slurm (--slurm) could not be asked (the other hosts are still shown)"),
    options=[
        Opt("--json", kind=FLAG, help="machine-readable output (with --watch: one JSON object per line)"),
        Opt("--history", metavar="N", convert=positive_int, default=10, help="recent runs to show (default 10)"),
        Opt("--watch", kind=FLAG, help="keep showing the status until Ctrl-C"),
        Opt("--every", metavar="D", convert=duration(minimum=0.1), needs=("--watch", "is how often --watch redraws"),
            help="with --watch: how often (default 2s)"),
        *host_options("HOST's queue", "several: each one's status, in turn (with --json, a list)"),
        Opt("--slurm", kind=FLAG, help="the Slurm partitions the host config's [slurm.classes] name: running "
                                       "jobs, and pending ones in Slurm's priority order with its reasons "
                                       "(default: $SLOTQ_BACKEND=slurm)"),
    ],
)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    if use_slurm(opts):
        render = _slurm(opts.json)
    elif opts.host:
        render = _Remote(opts)
    else:
        render = _local(opts.history, opts.json)
    if not opts.watch:
        sys.stdout.write(render(False, False))
        if isinstance(render, _Remote) and render.unreachable:
            from slotq.errors import HostUnavailable

            sys.stdout.flush()
            for line in render.unreachable:
                sys.stderr.write(f"slotq status: error: {line}\n")
            return HostUnavailable.exit_code
        return 0
    return watch(render, 2.0 if opts.every is None else opts.every, as_json=opts.json)


Render = Callable[[bool, bool], str]  # (watching, on a terminal) -> text ending in a newline


def watch(render: Render, every: float, as_json: bool = False) -> int:
    """Show `render()` every `every` seconds until Ctrl-C or SIGTERM. On a
    terminal: the alternate screen, redrawn in place, cursor hidden; the
    terminal is restored on the way out, whatever ends us. In a pipe:
    plain snapshots, each after a line naming its time."""
    import signal

    tty = not as_json and sys.stdout.isatty() and os.environ.get("TERM", "") not in ("", "dumb")

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    if tty:
        sys.stdout.write("\x1b[?1049h\x1b[?25l")  # alternate screen, cursor hidden
    try:
        while True:
            try:
                text = render(True, tty)
            except SlotqError as e:
                text = f"slotq status: {e}\n"
            if tty:
                size = shutil.get_terminal_size()
                lines = [fit(ln, size.columns) for ln in text.splitlines()[:max(1, size.lines - 1)]]
                sys.stdout.write("\x1b[H" + "".join(ln + "\x1b[K\n" for ln in lines) + "\x1b[J")
            elif as_json:
                sys.stdout.write(text)
            else:
                sys.stdout.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}\n{text}\n")
            sys.stdout.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        return 0
    finally:
        if tty:
            sys.stdout.write("\x1b[?25h\x1b[?1049l")  # cursor back, the screen as it was
            sys.stdout.flush()


def fit(line: str, columns: int) -> str:
    """`line` in at most `columns - 1` terminal cells (cut, with an
    ellipsis): a line that wrapped would push the view down, and the next
    frame would not cover the last (the last column stays free, as erasing
    from there would take its character). Colour sequences take no cell and
    are kept whole; wide characters take two."""
    import re
    import unicodedata

    def cells(ch: str) -> int:
        return 2 if unicodedata.east_asian_width(ch) in "WF" else 1

    if columns < 2:
        return ""
    parts = re.split(r"(\x1b\[[0-?]*[ -/]*[@-~])", line)  # text, sequence, text, ...
    if sum(cells(ch) for text in parts[0::2] for ch in text) <= columns - 1:
        return line
    out: list[str] = []
    room = max(0, columns - 2)  # and the ellipsis
    for k, part in enumerate(parts):
        if k % 2:
            out.append(part)
            continue
        for ch in part:
            room -= cells(ch)
            if room < 0:
                return "".join(out) + "…" + ("\x1b[0m" if len(parts) > 1 else "")
            out.append(ch)
    return "".join(out)  # (not reached: the line is wider than that)


def _with_records(snap: dict[str, object]) -> dict[str, object]:
    """A status snapshot whose recent runs are run records (record.py), as
    `history --json` gives them (docs/schema/status.json)."""
    from slotq.record import from_history

    runs = snap.get("history")
    if not isinstance(runs, list):
        return snap
    return dict(snap, history=[from_history(r) if isinstance(r, dict) else r for r in runs])


def _local(history_n: int, as_json: bool) -> Render:
    from slotq.config import HostConfig, state_dir_to_read
    from slotq.host.status import format_snapshot, snapshot

    state_dir = state_dir_to_read()

    def render(watching: bool, tty: bool) -> str:
        config = HostConfig.load(state_dir=state_dir)
        snap = snapshot(state_dir, config, time.time(), history_n)
        if as_json:
            return json.dumps(_with_records(snap), indent=None if watching else 2) + "\n"
        return format_snapshot(snap, bars=tty, color=tty and not os.environ.get("NO_COLOR")) + "\n"

    return render


class _Remote:
    """The status of each host named by --host: a Render. A host that
    cannot be reached does not hide the others: in a snapshot it is an
    error on stderr (`.unreachable`, exit 121 once the rest are shown);
    under --watch, a line in its place."""

    def __init__(self, opts: Namespace) -> None:
        from slotq.transports.ssh import SshHost

        self.hosts = [SshHost(h, config=opts.ssh_config, options=opts.ssh_option, remote_slotq=opts.remote_slotq)
                      for h in opts.host.split(",") if h]
        self.as_json = opts.json
        self.history = opts.history
        self.unreachable: list[str] = []

    def __call__(self, watching: bool, tty: bool) -> str:
        from slotq.errors import HostUnavailable
        from slotq.host.status import format_snapshot

        out: list[str] = []
        snaps: list[dict[str, object]] = []
        self.unreachable = []
        for remote in self.hosts:
            try:
                snap = remote.status_snapshot(self.history)
                if self.as_json:
                    snap = _with_records(snap)
                if self.as_json and len(self.hosts) > 1 and not watching:
                    snaps.append(snap)
                elif self.as_json:
                    out.append(json.dumps(snap, indent=None if watching else 2) + "\n")
                else:  # drawn here, like a local one, headed by the name it was reached by
                    try:
                        out.append(format_snapshot(snap, bars=tty, color=tty and not os.environ.get("NO_COLOR"))
                                   + "\n")
                    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
                        # Another slotq's JSON, or none at all: one line, not a traceback.
                        raise HostUnavailable(f"host {remote.host}: unreadable status (not a slotq status "
                                              "this client can show; --json gives it as it came)",
                                              host=remote.host) from None
            except HostUnavailable as e:
                if not watching:
                    self.unreachable.append(str(e))
                elif self.as_json:
                    out.append(json.dumps({"host": remote.host, "error": str(e)}) + "\n")
                else:
                    out.append(f"{e}\n\n")
        if len(self.hosts) > 1 and self.as_json and not watching:
            return json.dumps(snaps, indent=2) + "\n"  # one document: a list, a host's status each
        return "".join(out)


def _slurm(as_json: bool) -> Render:
    from slotq.config import HostConfig

    config = HostConfig.load()

    def render(watching: bool, tty: bool) -> str:
        from slotq.errors import HostUnavailable
        from slotq.transports.slurm.ctl import format_partitions, partition_view

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
            return json.dumps({"partitions": views}, indent=None if watching else 2) + "\n"
        return format_partitions(views)

    return render
