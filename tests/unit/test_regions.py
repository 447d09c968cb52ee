from __future__ import annotations

import textwrap

import pytest

from audit.config import RegionSpec, Selection, StatementSelector
from audit.errors import ConfigError, ExitCode, RegionUnresolved
from audit.regions import resolve_regions

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


def test_unknown_function_names_region_and_function() -> None:
    with pytest.raises(RegionUnresolved) as info:
        resolve_regions(SOURCE, [spec("flush", Selection("Sched.missing"))], filename="s.py")
    assert "'flush'" in info.value.summary
    assert "Sched.missing" in info.value.summary
    assert info.value.exit_code == ExitCode.REGION_UNRESOLVED


def test_unmatched_anchor_names_region_function_and_anchor() -> None:
    selection = Selection("Sched.build", (StatementSelector("self.fence.clear()"),))
    with pytest.raises(RegionUnresolved) as info:
        resolve_regions(SOURCE, [spec("removal", selection)], filename="s.py")
    message = info.value.render()
    assert "'removal'" in message
    assert "Sched.build" in message
    assert "self.fence.clear()" in message


def test_overlapping_regions_are_rejected() -> None:
    a = spec("a", Selection("Sched.build", (StatementSelector("for bid in ids"),)))
    b = spec("b", Selection("Sched.build", (StatementSelector("fenced.append(bid)"),)))
    with pytest.raises(ConfigError, match="overlap at line 16"):
        resolve_regions(SOURCE, [a, b], filename="s")
