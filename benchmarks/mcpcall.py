"""The MCP server's cost per run (issue 47): a `run_command` of `true`
through `slotq mcp` -- one server, kept running as a harness keeps it,
driven by the SDK's own client over stdio -- against `slotq run -- true`
started as a command, each in a private state dir, alternated, medians of
`reps` calls each. Also the server's start (spawn to initialized)."""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time

from tools import SLOTQ, remove_work, settle


def run(reps: int = 20) -> dict[str, object]:
    try:
        import anyio
        from mcp.client.session import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client
    except ImportError:
        return {"note": "the mcp extra is not installed (pip install -e '.[mcp]')"}
    work = tempfile.mkdtemp(prefix="slotq-bench-mcp-")
    env = dict(os.environ, SLOTQ_STATE_DIR=os.path.join(work, "state"),
               SLOTQ_LEDGER=os.path.join(work, "ledger.sqlite"))
    env.pop("SLOTQ_CONFIG", None)
    cli_s: list[float] = []
    mcp_s: list[float] = []
    start_s: list[float] = []

    def cli_once() -> None:
        t = time.perf_counter()
        subprocess.run([SLOTQ, "run", "-q", "--", "true"], env=env, cwd=work, stdin=subprocess.DEVNULL,
                       check=True, timeout=60)
        cli_s.append(time.perf_counter() - t)

    async def body() -> None:
        params = StdioServerParameters(command=SLOTQ, args=["mcp", "--allow-dir", work], env=env, cwd=work)
        t = time.perf_counter()
        with open(os.devnull, "w") as null:
            async with stdio_client(params, errlog=null) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    start_s.append(time.perf_counter() - t)
                    for _ in range(2):  # warm
                        await session.call_tool("run_command", {"command": ["true"]})
                    for _ in range(reps):
                        await anyio.to_thread.run_sync(cli_once)
                        t = time.perf_counter()
                        result = await session.call_tool("run_command", {"command": ["true"]})
                        mcp_s.append(time.perf_counter() - t)
                        assert (result.structured_content or {}).get("outcome") == "passed", result

    try:
        settle()
        cli_once()  # warm
        cli_s.clear()
        anyio.run(body)
    finally:
        remove_work(work)
    cli, call = statistics.median(cli_s) * 1000, statistics.median(mcp_s) * 1000
    return {"reps": reps, "slotq_run_ms": round(cli, 1), "mcp_call_ms": round(call, 1),
            "x_slotq_run": round(call / cli, 2), "server_start_ms": round(start_s[0] * 1000, 1)}


def format_mcp(r: dict[str, object]) -> list[str]:
    if "note" in r:
        return ["MCP server: " + str(r["note"])]
    return [f"MCP server (issue 47), medians of {r['reps']} calls each, alternated: a run_command of `true` "
            f"through one running `slotq mcp` {r['mcp_call_ms']} ms vs `slotq run -- true` {r['slotq_run_ms']} ms "
            f"({r['x_slotq_run']}x); the server's start {r['server_start_ms']} ms (once per harness session)"]
