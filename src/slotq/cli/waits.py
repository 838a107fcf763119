"""`slotq waits`: what a work dir waited for, and when (the wait ledger)."""

from __future__ import annotations

import json
import os
import sys
import time

from slotq.cli.args import FLAG, Opt, Parser, check_dir, parse_window, window_options


PARSER = Parser(
    prog="slotq waits", usage="slotq waits [--dir DIR] [--since T] [--until T] [--json]",
    description="Show the waits recorded for a work dir (and the directories below it) in a time window, "
                "with two totals: sum (record by record) and union (overlaps merged: the wall-clock time the "
                "dir was blocked). Waits still in progress are listed apart; a dead waiter's open wait ends at "
                "its last heartbeat.",
    epilog=("exit codes: 0 shown, 64 bad arguments, 73 the wait ledger cannot be read, 74 the\n"
            "output cannot be written, 78 a $SLOTQ_LEDGER that cannot be used"),
    options=[
        Opt("--dir", metavar="DIR", default=".", help="the work dir (default: the current one)"),
        *window_options(),
        Opt("--json", kind=FLAG, help="machine-readable output"),
    ],
)


def main(args: list[str]) -> int:
    opts, _ = PARSER.parse(args)
    from slotq.durations import format_duration
    from slotq.client.ledger import Ledger, spool_path
    from slotq.config import ledger_path

    since, until = parse_window(opts)
    check_dir("--dir", opts.dir)
    path = ledger_path()
    if not os.path.exists(path) and not os.path.exists(spool_path(path)):
        credit_dict: dict[str, object] = {"workdir": os.path.realpath(opts.dir), "since": since, "until": until,
                                          "sum_s": 0.0, "union_s": 0.0, "waits": [], "in_progress": []}
    else:
        try:
            ledger = Ledger(path)
            credit_dict = ledger.credit(opts.dir, since, until).to_dict()
            credit_dict["set_aside"] = ledger.set_aside()
            ledger.close()
        except Exception as e:
            from slotq.errors import StateDirError

            raise StateDirError(f"cannot read the wait ledger {path}: {e}", path) from None
    if opts.json:
        json.dump(credit_dict, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if credit_dict.get("set_aside"):
        print(f"note: {credit_dict['set_aside']} unreadable line(s) of the wait ledger's spool were set aside "
              f"in {spool_path(path)}.bad (not counted)")

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    print(f"waits of {credit_dict['workdir']} from {stamp(since)} to {stamp(until)}")
    for w in credit_dict["waits"]:  # type: ignore[attr-defined]
        print(f"  {stamp(w['start'])}  {format_duration(w['seconds']):>7}  {w['kind']:8} {w['host']:12} "
              f"run {w['run_id']}" + ("  (waiter died; ended at its last heartbeat)"
                                      if w["closed_by"] == "heartbeat" else ""))
    for w in credit_dict["in_progress"]:  # type: ignore[attr-defined]
        print(f"  {stamp(w['start'])}  {format_duration(w['seconds']):>7}  {w['kind']:8} {w['host']:12} "
              f"run {w['run_id']}  (in progress, pid {w['pid']})")
    open_now = len(credit_dict["in_progress"])  # type: ignore[arg-type]
    print(f"total: sum {format_duration(float(credit_dict['sum_s']))}, "  # type: ignore[arg-type]
          f"union {format_duration(float(credit_dict['union_s']))}"  # type: ignore[arg-type]
          + (f" (finished waits; {open_now} still in progress, not counted)" if open_now else ""))
    return 0
