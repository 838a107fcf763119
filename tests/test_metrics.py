"""`slotq metrics` (cli/metrics.py): the host's queue in Prometheus's text
format -- checked by `promtool check metrics`, and scraped for real: a
`prometheus-node-exporter` reads `--textfile`'s file and a `prometheus`
scrapes it, both on loopback, and its query API answers the pool's
waiting count as the test set it up."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import Start, live_tickets, slotq_cmd, start_holder, wait_for

pytestmark = pytest.mark.timeout(90)


def metrics(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(slotq_cmd() + ["metrics", *args], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value, from an exposition."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


@pytest.fixture
def busy_pool(state_dir: Path, runs: Start, tmp_path: Path) -> Iterator[None]:
    """Two passed runs and a failed one in the history, a holder in the
    shared slot and two runs waiting behind it; the landing pool drained."""
    for argv in (["true"], ["true"], ["false"]):
        subprocess.run(slotq_cmd() + ["run", "-q", "--", *argv], timeout=30, cwd=tmp_path, capture_output=True)
    gate = tmp_path / "gate"
    start_holder(runs, state_dir, gate)
    for i in range(2):
        runs("-q", "--", "true", name=f"w{i}")
        wait_for(lambda: len(live_tickets(state_dir)) == i + 1, what=f"w{i} in line")
    done = subprocess.run(slotq_cmd() + ["host", "drain", "landing", "--reason", "disk swap"], capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    yield
    gate.touch()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian's prometheus: scripts/test)")
def test_metrics_say_the_pools_as_they_are_and_promtool_accepts_them(busy_pool: None, tmp_path: Path) -> None:
    got = metrics()
    assert got.returncode == 0, got.stderr
    lint = subprocess.run(["promtool", "check", "metrics"], input=got.stdout, capture_output=True, text=True,
                          timeout=30)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    s = samples(got.stdout)
    assert s['slotq_pool_slots{pool="shared"}'] == 1
    assert s['slotq_pool_busy_slots{pool="shared"}'] == 1 and s['slotq_pool_busy_slots{pool="landing"}'] == 0
    assert s['slotq_pool_waiting_runs{pool="shared"}'] == 2
    assert s['slotq_pool_oldest_wait_seconds{pool="shared"}'] > 0
    assert s['slotq_pool_drained{pool="landing"}'] == 1 and s['slotq_pool_drained{pool="shared"}'] == 0
    assert s['slotq_runs_total{pool="shared",outcome="passed",blame="work"}'] == 2
    assert s['slotq_runs_total{pool="shared",outcome="failed",blame="work"}'] == 1
    assert s['slotq_wait_seconds_count{pool="shared"}'] == 3
    assert s['slotq_wait_seconds_bucket{pool="shared",le="+Inf"}'] == 3
    assert s['slotq_run_seconds_bucket{pool="shared",le="1"}'] <= s['slotq_run_seconds_bucket{pool="shared",le="10"}']
    assert "# TYPE slotq_runs_total counter" in got.stdout and "# TYPE slotq_wait_seconds histogram" in got.stdout


def test_metrics_textfile_is_written_whole_and_a_bad_dir_is_one_line(state_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    out.mkdir()
    assert metrics("--textfile", str(out)).returncode == 0
    assert [p.name for p in out.iterdir()] == ["slotq.prom"]
    assert (out / "slotq.prom").read_text().startswith("# HELP slotq_info")
    bad = metrics("--textfile", str(tmp_path / "nope"))
    assert bad.returncode == 74 and bad.stderr.count("\n") == 1 and "cannot write" in bad.stderr
    assert metrics("--bogus").returncode == 64


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    """The JSON a URL answers, or None while nothing listens there."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("prometheus-node-exporter") is None,
                    reason="needs Debian's prometheus and prometheus-node-exporter (scripts/test installs them)")
def test_prometheus_scrapes_the_textfile_through_node_exporter_and_answers_the_waiting_count(
        busy_pool: None, tmp_path: Path) -> None:
    textfile, tsdb = tmp_path / "textfile", tmp_path / "tsdb"
    textfile.mkdir()
    assert metrics("--textfile", str(textfile)).returncode == 0
    exporter_port, prom_port = _port(), _port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: node\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{exporter_port}']\n")
    procs = [
        subprocess.Popen(["prometheus-node-exporter", "--collector.disable-defaults", "--collector.textfile",
                          f"--collector.textfile.directory={textfile}", f"--web.listen-address=127.0.0.1:{exporter_port}"],
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "exporter.log", "wb")),
        subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                          f"--web.listen-address=127.0.0.1:{prom_port}"],
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb")),
    ]
    try:
        query = urllib.parse.quote('slotq_pool_waiting_runs{pool="shared"}')
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?query={query}"

        def answered() -> Any:
            got = _get(url)
            return (got.get("data") or {}).get("result") or None if isinstance(got, dict) else None

        result = wait_for(answered, timeout=60, what="prometheus has scraped slotq's metrics from node_exporter")
        assert result[0]["value"][1] == "2", result
        drained = _get(f"http://127.0.0.1:{prom_port}/api/v1/query?query="
                       + urllib.parse.quote('slotq_pool_drained{pool="landing"}'))
        assert drained is not None and drained["data"]["result"][0]["value"][1] == "1"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
