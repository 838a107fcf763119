"""`slotq attach RUN_ID`: come back to a kept run (`slotq run --attach-for`
or `--detach`): its status lines while it waits, its output from where you
last read, and -- if it ends meanwhile -- its result exactly as `slotq run`
would have given it; else, after --for, leave again (exit 75)."""

from __future__ import annotations

from slotq.cli.args import FLAG, JsonResult, Namespace, Opt, Parser, duration, host_options, run_id_and_options
from slotq.cli.run import JUNIT_OPTION

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slotq.transports.base import Transport

PARSER = Parser(
    prog="slotq attach", usage="slotq attach RUN_ID [--for D] [--from-start] [--json FILE] [-q]",
    command="positional",
    description="Come back to a kept run of yours (slotq run --attach-for / --detach): show where it is, "
                "its output from where you last read, and if it ends within --for, its result and exit code "
                "as `slotq run` gives them; otherwise leave it again, exit 75. Every attach renews the run's "
                "lease. A stop signal (Ctrl-C, a harness's SIGTERM) leaves the run, which goes on; "
                "`slotq cancel RUN_ID` gives it up. A run that ended and whose result was taken already is "
                "answered from the history (its result, not its output).",
    options=[
        Opt("--for", dest="attach_for", metavar="D", convert=duration(allow_zero=True),
            help="stay attached at most D (default: until the run ends)"),
        Opt("--from-start", kind=FLAG, help="its output from the start, not from where you last read"),
        Opt("--renew", kind=FLAG, help="only renew the run's lease (no output, no waiting)"),
        Opt("--json", metavar="FILE", help="write the result as JSON to FILE (- for stdout), as `slotq run`"),
        JUNIT_OPTION,
        Opt("-q", "--quiet", kind=FLAG, help="no status lines on stderr but the last"),
        *host_options("the run is on HOST, reached", "one host: the one the run was started on (several: a run "
                      "late-bound over them, whose process is kept here)"),
    ],
)


def main(args: list[str]) -> int:
    from slotq.spec import RunSpec

    run_id, opts = run_id_and_options(PARSER, args)
    _kept_here_if_several(opts)
    if opts.renew and not opts.host:
        from slotq.cli.hostkeep import attach

        return attach([run_id, "--renew"])
    if opts.renew:
        return _renew_over_ssh(opts, run_id)
    from slotq.cli.run import Reports, _stderr_line
    from slotq.client.caller import run

    json_result = JsonResult(opts.json)
    reports = Reports(opts.junit, None if opts.quiet else _stderr_line)
    transport = attach_transport(opts, run_id)
    spec = RunSpec(["?"], run_id=run_id)
    try:
        result = run(spec, transport, status=reports.say, handle_sigint=True)
        if opts.quiet and result.said_when_quiet:
            from slotq.client.result import summary_line

            _stderr_line(summary_line(result))
        reports.done(result)
        json_result.write(result.to_json, open_line=result.open_line)
    finally:
        json_result.discard()
        reports.discard()
    return result.exit_code


def attach_transport(opts: Namespace, run_id: str) -> "Transport":
    """The transport that attaches to kept run `run_id` (here, or on
    --host) for `slotq attach`'s options (and the MCP server's attach_run)."""
    from slotq.transports.kept import KeptTransport, attach_args, over_ssh

    _kept_here_if_several(opts)
    if not opts.host:
        return KeptTransport.attach(run_id, attach_for=opts.attach_for, from_start=opts.from_start)
    from slotq.cli.args import ssh_transport

    return over_ssh(ssh_transport(opts, opts.host, sync="none"), attach_args(run_id, opts.attach_for,
                                                                           opts.from_start))


def _kept_here_if_several(opts: Namespace) -> None:
    """A run kept over several hosts (`run --host A,B --detach`) is kept
    here: its process holds the reservations (client/standin.py)."""
    if opts.host and "," in opts.host:
        opts.host = None


def _renew_over_ssh(opts: Namespace, run_id: str) -> int:
    import sys

    from slotq.transports.ssh import SshHost

    ssh = SshHost(opts.host, config=opts.ssh_config, options=opts.ssh_option, remote_slotq=opts.remote_slotq)
    ssh.ensure_master()
    rc, out, err = ssh.call(f"host attach {run_id} --renew", 60, f"host {opts.host} did not answer within 60 s")
    sys.stdout.write(out.decode(errors="replace"))
    sys.stderr.write(err.decode(errors="replace")[-2000:])
    return rc
