"""Output CI systems understand, switched on by the variables they set
(docs/ci.md):

- GitHub Actions (`GITHUB_ACTIONS=true`): the waiting lines in a
  collapsible group; one annotation for an outcome that is not `passed`
  (an error for the work's, a warning for the infrastructure's, a notice
  for the caller's, each naming the blame); a row in the step summary
  (`$GITHUB_STEP_SUMMARY`) and the run's outcome, exit code, run id and
  wait as step outputs (`$GITHUB_OUTPUT`);
- GitLab CI (`GITLAB_CI=true`): the waiting lines in a collapsed section;
- anywhere, `--junit PATH`: the run as a JUnit XML report (`junit`).

Everything here is a few lines of text, written with the standard library;
none of it is loaded by a run outside CI without --junit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .result import RunResult

WAIT_TITLE = "slotq: waiting for a slot"
WAITING = "slotq: waiting"  # how every waiting line starts (client/waitlines.py)
LEVELS = {"work": "error", "infrastructure": "warning", "task": "warning", "caller": "notice", "none": "notice"}
SUMMARY_HEAD = "| slotq | outcome | blame | exit | waited | ran | host | slot | run |\n|---|---|---|---|---|---|---|---|---|\n"


def system(env: Mapping[str, str] | None = None) -> str | None:
    """"github", "gitlab" or None: the CI system whose variables are set."""
    env = os.environ if env is None else env
    if env.get("GITHUB_ACTIONS") == "true":
        return "github"
    if env.get("GITLAB_CI") == "true":
        return "gitlab"
    return None


class CiLines:
    """The status lines of one run, in its CI system's words: wraps `say`
    (a line to stderr), opening the group or section before the first
    waiting line and closing it before the first line that is not one;
    `finish` closes it if still open and says the outcome."""

    def __init__(self, kind: str, say: Callable[[str], None], env: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self.say = say
        self.env = os.environ if env is None else env
        self.open = False
        self.section = f"slotq_wait_{os.getpid()}_{int(time.time())}"

    def __call__(self, line: str) -> None:
        waiting = line.startswith(WAITING)
        if waiting and not self.open:
            self._begin()
        elif not waiting and self.open:
            self._end()
        self.say(line)

    def _begin(self) -> None:
        self.open = True
        if self.kind == "github":
            self.say(f"::group::{_data(WAIT_TITLE)}")
        else:
            self.say(f"\x1b[0Ksection_start:{int(time.time())}:{self.section}[collapsed=true]\r\x1b[0K{WAIT_TITLE}")

    def _end(self) -> None:
        self.open = False
        if self.kind == "github":
            self.say("::endgroup::")
        else:
            self.say(f"\x1b[0Ksection_end:{int(time.time())}:{self.section}\r\x1b[0K")

    def finish(self, result: RunResult) -> None:
        """The run's end: the group closed; under GitHub Actions, the
        annotation, the step summary's row and the step outputs."""
        if self.open:
            self._end()
        if self.kind != "github":
            return
        from .result import summary_line

        outcome = result.outcome.value
        if outcome != "passed":
            level = LEVELS.get(result.blame, "warning")
            title = f"slotq: {outcome} ({result.blame}'s)"
            self.say(f"::{level} title={_property(title)}::{_data(summary_line(result))}")
        _append(self.env.get("GITHUB_STEP_SUMMARY"), _summary_row(result), SUMMARY_HEAD)
        outputs = {"slotq_outcome": outcome, "slotq_blame": result.blame, "slotq_exit_code": str(result.exit_code),
                   "slotq_run_id": result.run_id or "", "slotq_waited_s": _seconds(result.waited_s)}
        _append(self.env.get("GITHUB_OUTPUT"), "".join(f"{k}={v}\n" for k, v in outputs.items()), None)


def wrap(say: Callable[[str], None] | None, quiet_say: Callable[[str], None]) -> tuple[
        Callable[[str], None] | None, CiLines | None]:
    """`say` in the CI system's words, and the CiLines to finish with; both
    unchanged (None) outside CI. `quiet_say`: where a quiet run's (no
    `say`) annotation goes."""
    kind = system()
    if kind is None:
        return say, None
    lines = CiLines(kind, say or quiet_say)
    return (lines if say is not None else None), lines


def _data(text: str) -> str:
    """A workflow command's message, escaped as GitHub's toolkit does."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    """A workflow command's property value (`title=`), escaped."""
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _seconds(s: float | None) -> str:
    return "" if s is None else f"{s:.3f}"


def _cell(text: object) -> str:
    """A Markdown table cell: no pipe or line break of its own."""
    return str(text if text is not None else "-").replace("|", "\\|").replace("\n", " ")[:200]


def _summary_row(result: RunResult) -> str:
    from ..durations import format_duration

    def took(s: float | None) -> str:
        return "-" if s is None else format_duration(s)

    label = result.label or "slotq run"
    cells = [label, result.outcome.value, result.blame, result.exit_code, took(result.waited_s), took(result.ran_s),
             result.host, result.slot, result.run_id]
    return "| " + " | ".join(_cell(c) for c in cells) + " |\n"


def _append(path: str | None, text: str, head: str | None) -> None:
    """Append `text` to the file the runner named (with `head` first if the
    file does not start with it yet); nothing if none was named. A file
    that cannot be written is one warning line, never the run's end."""
    if not path:
        return
    try:
        with open(path, "a+", encoding="utf-8") as f:
            if head is not None:
                f.seek(0)
                if f.read(len(head)) != head:
                    text = ("\n" if f.tell() else "") + head + text
            f.write(text)
    except OSError as e:
        import sys

        sys.stderr.write(f"slotq: warning: cannot write {path}: {e.strerror}\n")


def junit(result: RunResult) -> str:
    """The run as a JUnit XML report: one test case, named by its label
    (or its command); a failure for the work's outcomes, an error for the
    infrastructure's and the caller's, skipped for `not_admitted` and for
    a run not finished yet (`detached`); its outcome, blame, wait, run
    time and run id as properties."""
    import xml.etree.ElementTree as ET

    from .result import summary_line

    outcome, blame = result.outcome.value, result.blame
    name = result.label or "slotq run"
    ran = result.ran_s or 0.0
    suite = ET.Element("testsuite", name="slotq", tests="1", time=f"{ran:.3f}",
                       failures=str(int(blame == "work" and outcome != "passed")),
                       errors=str(int(blame in ("infrastructure", "caller", "task") and outcome != "not_admitted")),
                       skipped=str(int(outcome in ("not_admitted", "detached"))))
    case = ET.SubElement(suite, "testcase", name=_xml_text(name[:500]), classname=f"slotq.{result.cls}",
                         time=f"{ran:.3f}")
    props = ET.SubElement(case, "properties")
    for key, value in (("outcome", outcome), ("blame", blame), ("exit_code", result.exit_code),
                       ("waited_s", _seconds(result.waited_s)), ("ran_s", _seconds(result.ran_s)),
                       ("run_id", result.run_id), ("host", result.host), ("slot", result.slot)):
        ET.SubElement(props, "property", name=key, value=_xml_text("" if value is None else str(value)))
    message = _xml_text(summary_line(result))
    if outcome in ("not_admitted", "detached"):
        ET.SubElement(case, "skipped", message=message)
    elif blame == "work" and outcome != "passed":
        ET.SubElement(case, "failure", message=message, type=outcome).text = message
    elif outcome != "passed":
        ET.SubElement(case, "error", message=message, type=outcome).text = message
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode")


def _xml_text(text: str) -> str:
    """Text XML 1.0 can hold: control characters but tab and newline out."""
    return "".join(c if c in "\t\n" or (c >= " " and c not in "\ufffe\uffff") else "?" for c in text)
