"""docs/ci.md's recipes, run for real (issue 67): each is taken from the
page, not copied, and run against a real slotq pool -- the GitHub
workflow's step with the environment a runner gives (its workflow
commands, step summary and outputs read by parsers of GitHub's documented
formats), the GitLab pipeline by gitlab-ci-local's shell executor, and
the plain-git landing gate with two branches pushed at once -- and the
JUnit report read as XML."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import Run, Start, first_waited, slot_holder, slotq_cmd, start_holder, wait_for

DOC = Path(__file__).resolve().parent.parent / "docs" / "ci.md"
RUN_TESTS = '#!/bin/sh\nif [ -e broken ]; then echo "tests: 1 failed (broken)"; exit 3; fi\necho "tests: all passed"\n'


def block(starts: str) -> str:
    """The code block of docs/ci.md whose first line starts with `starts`."""
    found = [b for b in re.findall(r"```\w*\n(.*?)```", DOC.read_text(), flags=re.S) if b.startswith(starts)]
    assert len(found) == 1, f"docs/ci.md has {len(found)} blocks starting {starts!r}"
    return str(found[0])


def env_with_slotq(**extra: str) -> dict[str, str]:
    """This environment with the slotq under test first on PATH."""
    bin_dir = str(Path(slotq_cmd()[0]).parent)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}", **extra)


def work_tree(tmp: Path, broken: bool = False) -> Path:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    (work / "run-tests").write_text(RUN_TESTS)
    (work / "run-tests").chmod(0o755)
    if broken:
        (work / "broken").touch()
    return work


def hold(runs: Start, state_dir: Path, seconds: float) -> Run:
    holder = runs("-q", "--", "sleep", str(seconds), name=f"holder{time.monotonic_ns()}")
    wait_for(lambda: (slot_holder(state_dir) or {}).get("phase") == "running", what="the holder running")
    return holder


def hold_until_waited(runs: Start, state_dir: Path, tmp: Path, seconds: float) -> tuple[Run, threading.Thread]:
    """A holder of the shared slot that lets go once the first run in line
    has waited `seconds` (however slowly that run's CI tool started)."""
    gate = tmp / "gate"
    holder = start_holder(runs, state_dir, gate)

    def release() -> None:
        wait_for(lambda: first_waited(state_dir) > seconds, timeout=60, what=f"a run waiting {seconds} s")
        gate.touch()

    opener = threading.Thread(target=release, daemon=True)
    opener.start()
    return holder, opener


# ---------------------------------------------------------------- GitHub Actions

def workflow_commands(text: str) -> list[tuple[str, dict[str, str], str]]:
    """GitHub's workflow commands in `text`, as its documentation gives
    them: `::command key=value,key=value::message`, the message's %25 %0D
    %0A escaped, the properties' also %3A and %2C."""
    def unescape(s: str) -> str:
        for code, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
            s = s.replace(code, char)
        return s

    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"::([a-z-]+)(?: ([^:]*))?::(.*)", line)
        if m:
            props = dict(p.split("=", 1) for p in m.group(2).split(",")) if m.group(2) else {}
            out.append((m.group(1), {k: unescape(v) for k, v in props.items()}, unescape(m.group(3))))
    return out


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the Markdown tables in `text`, by their header's names."""
    rows, head = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            head = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if head is None:
            head = cells
        elif not all(set(c) <= {"-", ":"} for c in cells):
            rows.append(dict(zip(head, cells)))
    return rows


def github_step(tmp: Path, state_dir: Path) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """The workflow's slotq step, as a runner runs it (`bash -e`), in a
    work tree with ./run-tests; its summary and output files."""
    line = next(ln for ln in block("# .github/workflows/test.yml").splitlines() if "run: slotq run" in ln)
    context = {"github.repository": "acme/app", "github.sha": "0123abc"}
    script = re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: context[m.group(1)], line.split("run: ", 1)[1])
    summary, outputs = tmp / "step_summary.md", tmp / "github_output"
    env = env_with_slotq(GITHUB_ACTIONS="true", CI="true", GITHUB_STEP_SUMMARY=str(summary),
                         GITHUB_OUTPUT=str(outputs), SLOTQ_STATE_DIR=str(state_dir))
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp / "work", env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    return done, summary, outputs


@pytest.mark.timeout(90)
def test_the_github_step_groups_the_wait_and_reports_a_failure_as_the_works(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    work_tree(tmp_path, broken=True)
    holder, opener = hold_until_waited(runs, state_dir, tmp_path, 1.0)
    done, summary, outputs = github_step(tmp_path, state_dir)
    opener.join(5)
    assert done.returncode == 3, done.stderr  # the tests' own exit code
    assert "tests: 1 failed (broken)" in done.stdout
    commands = workflow_commands(done.stderr)
    names = [c for c, _, _ in commands]
    assert names[:2] == ["group", "endgroup"] and names.count("group") == names.count("endgroup") == 1, commands
    inside = done.stderr.split("::group::", 1)[1].split("::endgroup::", 1)[0]
    assert "slotq: waiting" in inside and "acquired" not in inside, inside
    [(level, props, message)] = [c for c in commands if c[0] in ("error", "warning", "notice")]
    assert level == "error" and props["title"] == "slotq: failed (work's)" and "failed (exit 3)" in message
    [row] = markdown_rows(summary.read_text())
    assert row["outcome"] == "failed" and row["blame"] == "work" and row["exit"] == "3", row
    assert row["slotq"] == "acme/app@0123abc" and row["slot"] == "shared#0", row
    got = dict(ln.split("=", 1) for ln in outputs.read_text().splitlines())
    assert got["slotq_outcome"] == "failed" and got["slotq_exit_code"] == "3" and got["slotq_run_id"] == row["run"]
    assert float(got["slotq_waited_s"]) >= 1.0, got
    suite = ET.parse(tmp_path / "work" / "junit.xml").getroot()
    assert (suite.tag, suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("testsuite", "1", "1", "0")
    assert holder.wait() == 0


@pytest.mark.timeout(90)
def test_the_github_step_reports_not_admitted_as_the_infrastructures_with_a_warning(
        state_dir: Path, runs: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "host.toml"
    config.write_text("[pools]\nshared = 1\nlanding = 1\n\n[admission]\nmax_waiting = 0\n")
    monkeypatch.setenv("SLOTQ_CONFIG", str(config))
    work_tree(tmp_path)
    holder = hold(runs, state_dir, 60)  # (it only has to be there: the run is refused at once)
    done, summary, outputs = github_step(tmp_path, state_dir)
    holder.kill()
    assert done.returncode == 117, done.stderr
    [(level, props, message)] = [c for c in workflow_commands(done.stderr) if c[0] in ("error", "warning")]
    assert level == "warning" and props["title"] == "slotq: not_admitted (infrastructure's)", props
    [row] = markdown_rows(summary.read_text())
    assert (row["outcome"], row["blame"], row["exit"]) == ("not_admitted", "infrastructure", "117")
    case = ET.parse(tmp_path / "work" / "junit.xml").getroot().find("testcase")
    assert case is not None and case.find("skipped") is not None and case.find("failure") is None
    props_xml = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props_xml["blame"] == "infrastructure" and props_xml["outcome"] == "not_admitted"


@pytest.mark.timeout(30)
def test_outside_ci_none_of_it_is_said(state_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in env_with_slotq().items() if k not in ("GITHUB_ACTIONS", "GITLAB_CI")}
    done = subprocess.run(slotq_cmd() + ["run", "--", "false"], env=env, capture_output=True, text=True, timeout=30,
                          cwd=tmp_path)
    assert done.returncode == 1 and "::" not in done.stderr and "section_" not in done.stderr, done.stderr


# ---------------------------------------------------------------- GitLab CI

def gitlab_pipeline(tmp: Path, state_dir: Path, job: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """The pipeline of docs/ci.md run by gitlab-ci-local's shell executor,
    in a git repository holding it and ./run-tests."""
    tool = shutil.which("gitlab-ci-local")
    if tool is None:
        pytest.skip("no gitlab-ci-local (scripts/test installs it, as root)")
    version = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
    if version.returncode != 0:  # (installed, but this machine's Node cannot run it)
        pytest.skip(f"gitlab-ci-local does not run here: {version.stderr.strip()[-200:]}")
    repo = tmp / "work"
    (repo / ".gitlab-ci.yml").write_text(block("# .gitlab-ci.yml"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost"]
    if not (repo / ".git").exists():
        subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, timeout=30)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "ci"], cwd=repo, check=True, timeout=30)
    args = [f"--variable={k}={v}" for k, v in {"SLOTQ_STATE_DIR": str(state_dir), "GITLAB_CI": "true",
                                               **variables}.items()]
    # (gitlab-ci-local sets GITLAB_CI=false of its own; a GitLab runner sets true.)
    return subprocess.run([tool, "--no-color", *args, job], cwd=repo, capture_output=True, text=True, timeout=120,
                          env=env_with_slotq(HOME=str(tmp)), stdin=subprocess.DEVNULL)


@pytest.mark.timeout(120)
def test_the_gitlab_job_waits_longer_than_its_budget_and_passes_in_a_collapsed_section(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    work_tree(tmp_path)
    holder, opener = hold_until_waited(runs, state_dir, tmp_path, 2.0)
    done = gitlab_pipeline(tmp_path, state_dir, "tests", TEST_BUDGET="1s", MAX_WAIT="5m")
    opener.join(5)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and re.search(r"^ PASS\s+tests\b", out, flags=re.M), out
    assert "tests: all passed" in out
    # GitLab's section markers (what the job printed; gitlab-ci-local shows
    # each line after "tests > ", its carriage returns as line breaks).
    start = re.search(r"\x1b\[0Ksection_start:(\d+):(slotq_wait_\w+)\[collapsed=true\]\s*\x1b\[0K", out)
    assert start, repr(out)
    end = re.search(r"\x1b\[0Ksection_end:(\d+):" + start.group(2) + r"\s*\x1b\[0K", out)
    assert end and int(end.group(1)) >= int(start.group(1)), out
    assert "slotq: waiting" in out[start.end():end.start()]
    record = ET.parse(tmp_path / "work" / "junit.xml").getroot()
    props = {p.get("name"): p.get("value") for p in record.iter("property")}
    assert props["outcome"] == "passed" and float(props["waited_s"] or 0) >= 2.0, props  # past its 1 s budget
    assert holder.wait() == 0


@pytest.mark.timeout(240)
def test_the_gitlab_job_fails_on_the_tests_and_only_warns_when_not_admitted(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    work_tree(tmp_path, broken=True)
    done = gitlab_pipeline(tmp_path, state_dir, "tests", TEST_BUDGET="30s", MAX_WAIT="5m")
    out = done.stdout + done.stderr
    assert re.search(r"tests finished in .*FAIL 3", out) and re.search(r"^ FAIL\s+tests\b", out, flags=re.M), out
    (tmp_path / "work" / "broken").unlink()
    gate = tmp_path / "gate"
    holder = start_holder(runs, state_dir, gate)  # the shared slot, until the gate opens
    done = gitlab_pipeline(tmp_path, state_dir, "tests", TEST_BUDGET="30s", MAX_WAIT="1s")
    out = done.stdout + done.stderr
    # not_admitted (117): the recipe's allow_failure rule makes it a warning
    assert re.search(r"tests finished in .*WARN 117", out) and re.search(r"^ WARN\s+tests\b", out, flags=re.M), out
    assert "not_admitted" in out
    # The landing job, with the shared slot still held: its own slot, no wait.
    done = gitlab_pipeline(tmp_path, state_dir, "land", TEST_BUDGET="30s")
    out = done.stdout + done.stderr
    assert re.search(r"^ PASS\s+land\b", out, flags=re.M) and "slot landing#0 acquired" in out, out
    assert holder.proc.poll() is None, "the shared slot's holder ended: the landing may have waited for it"
    gate.touch()
    assert holder.wait() == 0


# ---------------------------------------------------------------- the landing gate

def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


@pytest.mark.timeout(120)
def test_the_landing_gate_lands_the_passing_branch_refuses_the_failing_one_one_at_a_time(
        state_dir: Path, runs: Start, tmp_path: Path) -> None:
    origin, seed = tmp_path / "origin.git", tmp_path / "seed"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True, timeout=30)
    subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True, timeout=30)
    log = tmp_path / "landings.log"  # each landing's tests stamp their start and end here
    (seed / "run-tests").write_text('#!/bin/sh\necho start >> "$LAND_LOG"\nsleep 1\necho end >> "$LAND_LOG"\n'
                                    + RUN_TESTS.split("\n", 1)[1])
    (seed / "run-tests").chmod(0o755)
    git("add", "-A", cwd=seed)
    git("commit", "-q", "-m", "tests", cwd=seed)
    git("push", "-q", str(origin), "main", cwd=seed)
    for branch, path in (("good", "feature.txt"), ("bad", "broken")):
        git("checkout", "-q", "-b", branch, "main", cwd=seed)
        (seed / path).write_text(branch + "\n")
        git("add", "-A", cwd=seed)
        git("commit", "-q", "-m", branch, cwd=seed)
        git("push", "-q", str(origin), branch, cwd=seed)
    gate = tmp_path / "land"
    gate.write_text(block("#!/bin/sh\n# land REPO BRANCH"))
    gate.chmod(0o755)
    holder = runs("-q", "--", "sleep", "60", name="shared-holder")  # the shared pool's slot, all along
    wait_for(lambda: (slot_holder(state_dir) or {}).get("phase") == "running", what="the shared holder running")
    env = env_with_slotq(SLOTQ_STATE_DIR=str(state_dir), LAND_LOG=str(log))

    def land(branch: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(gate), str(origin), branch], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

    # Both branches are pushed; the second gate starts while the first
    # lands (its waiting line then names it: not its "starting" moment).
    gates = {"good": land("good")}
    wait_for(lambda: (slot_holder(state_dir, "landing") or {}).get("phase") == "running",
             what="the first landing holding the landing slot")
    gates["bad"] = land("bad")
    said = {b: p.communicate(timeout=90) for b, p in gates.items()}
    codes = {b: p.returncode for b, p in gates.items()}
    assert holder.proc.poll() is None, "the shared slot's holder delayed a landing"
    holder.kill()
    assert codes == {"good": 0, "bad": 3}, said
    assert "land: good landed on main" in said["good"][0]
    assert "tests: 1 failed (broken)" in said["bad"][0] and "land: bad refused (exit 3)" in said["bad"][1]
    landed = git("log", "--format=%s", "main", cwd=origin).split()
    assert "good" in landed and "bad" not in landed, landed
    # One at a time: the second waited for the first, and said whose landing it was.
    history = json.loads(subprocess.run(slotq_cmd() + ["history", "--json", "--since", "1h"], capture_output=True,
                                        text=True, timeout=30, env=env).stdout)
    lands = sorted((r for r in history if r["class"] == "landing"), key=lambda r: r["phases"]["slot"])
    assert [r["label"] for r in lands] == ["land good", "land bad"], lands
    assert log.read_text().split() == ["start", "end", "start", "end"], "two landings at once"
    assert "slot held by land good" in said["bad"][1], said["bad"][1]


@pytest.mark.timeout(10)
def test_the_junit_report_of_every_outcome_is_a_failure_an_error_or_skipped_by_its_blame() -> None:
    from slotq.client.ci import junit
    from slotq.client.result import RunResult
    from slotq.outcome import Outcome
    from slotq.spec import RunSpec

    kinds = {}
    for outcome in Outcome.members():
        result = RunResult(RunSpec(["pytest", "-q"], label="pr-7 <&> \x07 tests"), "h")
        result.outcome, result.command_code = outcome, (0 if outcome is Outcome.PASSED else 2)
        case = ET.fromstring(junit(result)).find("testcase")
        assert case is not None and case.get("name") == "pr-7 <&> ? tests"
        found = [e.tag for e in case if e.tag != "properties"]
        kinds[outcome.value] = found[0] if found else "passed"
    assert kinds == {"passed": "passed", "failed": "failure", "exec_timeout": "failure", "idle_timeout": "failure",
                     "prepare_failed": "failure", "backstop": "error", "unavailable": "error",
                     "not_admitted": "skipped", "cancelled": "error", "caller_gone": "error",
                     "budget_exhausted": "error", "deadline": "error", "detached": "skipped"}
