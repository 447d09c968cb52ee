from __future__ import annotations

import textwrap

import pytest

from audit.core.errors import ConfigError, ExitCode, RegionUnresolved
from audit.setup.region_specs import RegionSpec, Selection, StatementSelector
from audit.setup.regions import resolve_regions

SOURCE = textwrap.dedent(
    '''
    class Sched:
        def remove(self, job, ids):
            """Docstring is not part of the region."""
            for bid in ids or ():
                pending = self.fence[bid]
                pending.remove(job)
                if not pending:
                    del self.fence[bid]

        def build(self, req, ids):
            fenced = []
            for bid in ids:
                if bid == 0:
                    continue
                fenced.append(bid)
            if req.is_finished():
                log("finished")
            if req.is_finished():
                for bid in fenced:
                    self.fence.setdefault(bid, set()).add(1)
            return fenced
    '''
)


def spec(name: str, *selections: Selection) -> RegionSpec:
    return RegionSpec(name=name, description="", selections=selections)


def test_whole_function_region_spans_its_body_without_docstring() -> None:
    (region,) = resolve_regions(SOURCE, [spec("removal", Selection("Sched.remove"))], filename="s")
    assert (region.spans[0].start, region.spans[0].end) == (5, 9)


def test_statement_anchor_selects_the_whole_compound_statement() -> None:
    selection = Selection("Sched.build", (StatementSelector("for bid in ids"),))
    (region,) = resolve_regions(SOURCE, [spec("r", selection)], filename="s")
    assert [(s.start, s.end) for s in region.spans] == [(13, 16)]


def test_header_part_keeps_only_the_header_line() -> None:
    selection = Selection(
        "Sched.build",
        (StatementSelector("if req.is_finished()", part="header", containing="setdefault"),),
    )
    (region,) = resolve_regions(SOURCE, [spec("r", selection)], filename="s")
    assert [(s.start, s.end) for s in region.spans] == [(19, 19)]


def test_anchor_matching_several_statements_selects_each() -> None:
    selection = Selection("Sched.build", (StatementSelector("if req.is_finished()"),))
    (region,) = resolve_regions(SOURCE, [spec("r", selection)], filename="s")
    assert [(s.start, s.end) for s in region.spans] == [(17, 18), (19, 21)]


def test_regions_survive_a_line_shift() -> None:
    selection = Selection("Sched.build", (StatementSelector("fenced.append(bid)"),))
    (before,) = resolve_regions(SOURCE, [spec("r", selection)], filename="s")
    (after,) = resolve_regions("\n\n\n" + SOURCE, [spec("r", selection)], filename="s")
    assert after.spans[0].start == before.spans[0].start + 3


def test_anchor_whitespace_and_formatting_do_not_matter() -> None:
    reformatted = SOURCE.replace("fenced.append(bid)", "fenced.append(\n                    bid)")
    selection = Selection("Sched.build", (StatementSelector("fenced.append(  bid )"),))
    (region,) = resolve_regions(reformatted, [spec("r", selection)], filename="s")
    assert (region.spans[0].start, region.spans[0].end) == (16, 17)


def test_unknown_function_names_region_function_and_closest() -> None:
    with pytest.raises(RegionUnresolved) as info:
        resolve_regions(SOURCE, [spec("flush", Selection("Sched.buildd"))], filename="s.py")
    message = info.value.render()
    assert info.value.summary == "1 region anchor does not resolve in s.py"
    assert "flush: no function Sched.buildd; closest: Sched.build (line 11)" in message
    assert info.value.exit_code == ExitCode.REGION_UNRESOLVED


def test_unmatched_anchor_names_region_function_anchor_and_closest() -> None:
    selection = Selection("Sched.build", (StatementSelector("for bid in fenced_ids"),))
    with pytest.raises(RegionUnresolved) as info:
        resolve_regions(SOURCE, [spec("removal", selection)], filename="s.py")
    message = info.value.render()
    assert "removal: no statement matching 'for bid in fenced_ids' in Sched.build" in message
    # the closest statement of that function, of the same kind (a loop), with its line
    assert "closest: 'for bid in fenced:' (line 20)" in message


def test_every_unresolved_anchor_is_listed_at_once() -> None:
    specs = [
        spec("a", Selection("Sched.gone")),
        spec(
            "b",
            Selection(
                "Sched.build",
                (
                    StatementSelector("x = 1"),
                    StatementSelector("y"),
                ),
            ),
        ),
        spec("c", Selection("Sched.remove", (StatementSelector("del self.fence[bid]"),))),
    ]
    with pytest.raises(RegionUnresolved) as info:
        resolve_regions(SOURCE, specs, filename="s.py", version="0.28.0")
    assert info.value.summary == "3 region anchors do not resolve in s.py (vLLM 0.28.0)"
    listed = [v for k, v in info.value.details.items() if k.startswith("anchor ")]
    assert [line.split(":", 1)[0] for line in listed] == ["a", "b", "b"]
    assert "since" in info.value.details["next"]


def test_alternatives_are_tried_in_order() -> None:
    selection = Selection(
        "Sched.prune",
        (StatementSelector("self.fence.clear()", alternatives=("for bid in fenced", "return")),),
        alternatives=("Sched.build",),
    )
    (region,) = resolve_regions(SOURCE, [spec("r", selection)], filename="s")
    assert [(s.function, s.start, s.anchor) for s in region.spans] == [
        ("Sched.build", 20, "for bid in fenced")
    ]


def test_a_part_introduced_later_is_absent_before_its_release_and_an_error_after() -> None:
    later = Selection("Sched.build", (StatementSelector("self.jobs[j] = 1", since="0.29.0"),))
    gone = Selection("Sched.aligned", since="0.29.0")
    whole = Selection("Sched.remove")
    specs = [spec("r", whole, later, gone)]
    (region,) = resolve_regions(SOURCE, specs, filename="s", version="0.28.0")
    assert [str(a) for a in region.absent] == [
        "Sched.build: self.jobs[j] = 1 (since vLLM 0.29.0)",
        "Sched.aligned (since vLLM 0.29.0)",
    ]
    assert region.functions == ("Sched.remove",)
    with pytest.raises(RegionUnresolved, match="2 region anchors"):
        resolve_regions(SOURCE, specs, filename="s", version="0.29.0")
    with pytest.raises(RegionUnresolved, match="2 region anchors"):
        resolve_regions(SOURCE, specs, filename="s", version="0.30.0rc1")


def test_overlapping_regions_are_rejected() -> None:
    a = spec("a", Selection("Sched.build", (StatementSelector("for bid in ids"),)))
    b = spec("b", Selection("Sched.build", (StatementSelector("fenced.append(bid)"),)))
    with pytest.raises(ConfigError, match="overlap at line 16"):
        resolve_regions(SOURCE, [a, b], filename="s")
