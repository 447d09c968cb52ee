"""The messages between fence-audit and its test process: every one, both ways."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from audit.core import protocol
from audit.core.protocol import (
    BaselineDone,
    BaselineSpec,
    Chain,
    Command,
    Done,
    ForcedFailChecked,
    Frame,
    Job,
    Judged,
    LineEdit,
    Member,
    MissingTests,
    MutantStatus,
    MutationSpec,
    Outcomes,
    PlainRunSpec,
    ProtocolError,
    TestOutcome,
    TestResult,
    Verdict,
    Warmed,
)

EDIT = LineEdit(12, 12, ("        return None", ""))
FRAME = Frame(10, 40, ((3, 4), (8, 9)), "from __future__ import annotations\nimport os\n")
JOB = Job(
    key="0f" * 16,
    id="Scheduler._remove_pending_job:ReplaceNumber@3:4-3:5#0",
    function="Scheduler._remove_pending_job",
    edits=(EDIT, LineEdit(20, 19, ("x = 1",))),
    tests=("tests/v1/a.py::test_one", "project/tests/fence/b.py::test_two[1-<x>]"),
    budgets={"tests/v1/a.py::test_one": 10.0, "project/tests/fence/b.py::test_two[1-<x>]": 12.5},
    timeout_s=52.5,
    frame=FRAME,
    module="vllm.other",
    path="/somewhere/other.py",
    env={"HYPOTHESIS_PROFILE": "deep"},
    lines=(12, 20),
    cost=4.5,
)
MEMBER = Member("1", (12,))
CHAIN = Chain((Member(JOB.key, JOB.lines), MEMBER))
VERDICT = Verdict(
    MutantStatus.KILLED, "tests/v1/a.py::test_one", "AssertionError: é", ("tests/v1/a.py",), 0.25
)

# One value of every message type, with no field left at its default.
SAMPLES: dict[type, Any] = {
    LineEdit: EDIT,
    Frame: FRAME,
    Job: JOB,
    Member: MEMBER,
    Chain: CHAIN,
    BaselineSpec: BaselineSpec(
        {"vllm.x": "/c/x.py"}, ("/c/x.py",), "/w/data", "/w/out.json", ("-q", "-p", "no:x"), 7
    ),
    PlainRunSpec: PlainRunSpec({"vllm.x": "/t/m.py"}, ("t.py::a", "t.py::b"), ("-x",)),
    MutationSpec: MutationSpec(
        overlay={"vllm.x": "/c/x.py"},
        pytest_args=("tests/x.py", "--tb=native"),
        warm_up=JOB.tests,
        target_module="vllm.x",
        target_path="/c/x.py",
        results_dir="/cache/results",
        workers=3,
        max_hangs=2,
        jobs=(JOB, dataclasses.replace(JOB, key="1", frame=None, module="", path="")),
        forced_fail=dataclasses.replace(JOB, key="forced-fail-1"),
        whole_failure=True,
        chains=(CHAIN,),
    ),
    Command: Command("mutate", "/w/executor-spec.json"),
    Verdict: VERDICT,
    TestResult: TestResult("t.py::x[<1>]", TestOutcome.XFAILED, 1.5, "reason"),
    Outcomes: Outcomes(
        4,
        2,
        (("tests/broken.py", "ImportError: no"), ("", "usage")),
        (
            TestResult("t.py::a", TestOutcome.PASSED, 0.1),
            TestResult("t.py::b", TestOutcome.ERROR, 2, "E"),
        ),
    ),
    BaselineDone: BaselineDone(1),
    MissingTests: MissingTests(("t.py::gone",), 3),
    Warmed: Warmed(443, 12, 2, 3.25, 1, ("t.py::red",), 372, 0.97),
    ForcedFailChecked: ForcedFailChecked(VERDICT),
    Judged: Judged(JOB.id, MutantStatus.TIMEOUT, 1.0, 1.5),
    Done: Done(),
}


def test_every_message_type_has_a_sample() -> None:
    messages = {
        value
        for value in vars(protocol).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and value.__module__ == protocol.__name__
    }
    assert messages == set(SAMPLES)


@pytest.mark.parametrize("message", SAMPLES.values(), ids=lambda m: type(m).__name__)
def test_message_round_trips_through_json_text(message: Any) -> None:
    text = json.dumps(protocol.to_json(message))
    assert protocol.from_json(type(message), json.loads(text)) == message


@pytest.mark.parametrize(
    "event",
    [m for m in SAMPLES.values() if type(m) in protocol.Event.__args__],
    ids=lambda e: type(e).__name__,
)
def test_event_round_trips_through_a_line_of_output(event: protocol.Event) -> None:
    line = protocol.event_line(event)
    assert line.endswith("\n")
    assert "\n" not in line[:-1]
    # pytest's progress dots may precede the marker on the same line
    assert protocol.parse_event("..." + line) == event


def test_a_line_of_pytest_output_is_no_event() -> None:
    assert protocol.parse_event("tests/x.py ..F.  [100%]\n") is None


@pytest.mark.parametrize(
    "spec", [SAMPLES[BaselineSpec], SAMPLES[PlainRunSpec], SAMPLES[MutationSpec]]
)
def test_spec_round_trips_through_its_file(tmp_path: Path, spec: protocol.Spec) -> None:
    protocol.write_spec(tmp_path / "spec.json", spec)
    assert protocol.read_spec(tmp_path / "spec.json") == spec


def test_verdict_round_trips_through_its_file_with_no_temporary_left(tmp_path: Path) -> None:
    protocol.save_verdict(tmp_path / "k.json", VERDICT)
    assert protocol.load_verdict(tmp_path / "k.json") == VERDICT
    assert [p.name for p in tmp_path.iterdir()] == ["k.json"]


def test_verdict_written_before_the_protocol_reads_with_its_defaults(tmp_path: Path) -> None:
    # What the executor wrote before the protocol existed: fields left out when empty.
    (tmp_path / "k.json").write_text('{"status": "survived", "tests_run": ["a"], "duration_s": 1}')
    assert protocol.load_verdict(tmp_path / "k.json") == Verdict(
        MutantStatus.SURVIVED, tests_run=("a",), duration_s=1.0
    )


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        ({"status": "killed", "colour": "red"}, "unexpected field 'colour'"),
        ({"killed_by": "t"}, "missing field 'status'"),
        ({"status": "maimed"}, "'maimed' is not a MutantStatus"),
        ({"status": "killed", "tests_run": "t.py::a"}, "Verdict.tests_run: expected a list"),
        ({"status": "killed", "duration_s": "1"}, "Verdict.duration_s: expected float"),
        ({"status": "killed", "duration_s": True}, "Verdict.duration_s: expected float"),
        ({"status": "killed", "tests_run": [1]}, r"Verdict.tests_run\[0\]: expected str"),
        (["killed"], "Verdict: expected an object"),
    ],
)
def test_a_message_that_does_not_fit_its_type_is_refused(data: Any, complaint: str) -> None:
    with pytest.raises(ProtocolError, match=complaint):
        protocol.from_json(Verdict, data)


def test_nested_errors_name_the_path_to_the_field() -> None:
    data = protocol.to_json(SAMPLES[MutationSpec])
    data["jobs"][1]["budgets"]["t"] = "ten"
    with pytest.raises(
        ProtocolError, match=r"MutationSpec.jobs\[1\].budgets\['t'\]: expected float"
    ):
        protocol.from_json(MutationSpec, data)


def test_a_long_list_or_table_read_whole_still_names_the_item_that_does_not_fit() -> None:
    # tests and budgets are read whole when every item fits (a whole module's spec
    # holds 700,000 of them); one that does not is still named by its place
    data = protocol.to_json(SAMPLES[MutationSpec])
    data["jobs"][0]["tests"] = [f"t{i}" for i in range(50)] + [7]
    with pytest.raises(ProtocolError, match=r"MutationSpec.jobs\[0\].tests\[50\]: expected str"):
        protocol.from_json(MutationSpec, data)
    data = protocol.to_json(SAMPLES[MutationSpec])
    data["jobs"][0]["budgets"] = {"a": 2.5, "b": 2, "c": True}
    with pytest.raises(ProtocolError, match=r"budgets\['c'\]: expected float"):
        protocol.from_json(MutationSpec, data)
    del data["jobs"][0]["budgets"]["c"]  # an integral budget is a float once read
    budgets = protocol.from_json(MutationSpec, data).jobs[0].budgets
    assert budgets == {"a": 2.5, "b": 2.0}
    assert all(type(v) is float for v in budgets.values())


def test_a_command_outside_the_vocabulary_is_refused() -> None:
    with pytest.raises(ProtocolError, match="'explode' is not one of"):
        protocol.from_json(Command, {"action": "explode"})


def test_an_unknown_event_or_spec_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="unknown event 'exploded'"):
        protocol.parse_event(protocol.PROGRESS + '{"event": "exploded"}\n')
    (tmp_path / "spec.json").write_text('{"kind": "party"}')
    with pytest.raises(ProtocolError, match="unknown spec kind 'party'"):
        protocol.read_spec(tmp_path / "spec.json")


def test_a_damaged_verdict_file_is_a_protocol_error(tmp_path: Path) -> None:
    (tmp_path / "k.json").write_text('{"status": "kil')
    with pytest.raises(ProtocolError, match=r"k\.json"):
        protocol.load_verdict(tmp_path / "k.json")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_test_process_imports_nothing_of_fence_audit_but_the_protocol() -> None:
    package = Path(protocol.__file__).parent / "testproc"
    allowed = ("pytest", "_pytest", "coverage", "audit.core.protocol", "audit.testproc")
    for module in sorted(package.glob("*.py")):
        for name in _imports(module):
            top = name.split(".")[0]
            ok = top in sys.stdlib_module_names or name.startswith(allowed) or name == "__future__"
            assert ok, f"{module.name} imports {name}"


def test_the_protocol_imports_only_the_standard_library() -> None:
    for name in _imports(Path(protocol.__file__)):
        assert name.split(".")[0] in sys.stdlib_module_names or name == "__future__", name
