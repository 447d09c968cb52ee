"""mutmut's mutations turned into our mutants: ids, edits, regions, covering tests."""

from __future__ import annotations

import difflib
import textwrap
import types

import pytest

from audit.core.protocol import LineEdit, apply_edits, edited_lines
from audit.mutation import generation, mutmut_adapter
from audit.mutation.mutants import (
    TestsOfLines,
    build_mutants,
    function_hashes,
    mutant_id,
    unified_diff,
)
from audit.setup.region_specs import RegionSpec, Selection, StatementSelector
from audit.setup.regions import resolve_regions
from audit.testproc import codeswap

SOURCE = textwrap.dedent(
    '''\
    class Fence:
        def register(self, job, blocks):
            """Register ``job`` on every non-null block.

            Continuation lines of a docstring are not re-indented by libcst.
            """
            for block in blocks:
                if block == 0:
                    continue
                self.pending.setdefault(block, set()).add(job)

        def remove(self, job, blocks):
            for block in blocks:
                jobs = self.pending[block]
                jobs.discard(job)
                if not jobs:
                    del self.pending[block]
    '''
)
REGIONS = (
    RegionSpec("population", "", (Selection("Fence.register", (StatementSelector("if block"),)),)),
    RegionSpec("removal", "", (Selection("Fence.remove", (StatementSelector("if not jobs"),)),)),
)


def test_every_mutation_applies_and_compiles() -> None:
    mutations = mutmut_adapter.generate(SOURCE, ["Fence.register", "Fence.remove"])
    assert len(mutations) > 5
    for mutation in mutations:
        mutated = apply_edits(SOURCE, mutation.edits)
        assert mutated != SOURCE
        compile(mutated, "fence.py", "exec")


def test_only_the_named_functions_are_mutated() -> None:
    mutations = mutmut_adapter.generate(SOURCE, ["Fence.remove"])
    assert {m.function for m in mutations} == {"Fence.remove"}


def test_ids_are_unique_and_survive_an_edit_elsewhere() -> None:
    before = [mutant_id(m) for m in mutmut_adapter.generate(SOURCE, ["Fence.remove"])]
    shifted = "import os\n\n\n" + SOURCE.replace("Register ``job``", "Register the job")
    after = [mutant_id(m) for m in mutmut_adapter.generate(shifted, ["Fence.remove"])]
    assert len(set(before)) == len(before)
    assert before == after
    assert all(i.startswith("Fence.remove:") for i in before)


def test_an_edit_inside_the_function_keeps_the_other_ids() -> None:
    before = {mutant_id(m) for m in mutmut_adapter.generate(SOURCE, ["Fence.remove"])}
    edited = SOURCE.replace(
        "                jobs.discard(job)\n", "                jobs.discard(job)  # x\n"
    )
    after = {mutant_id(m) for m in mutmut_adapter.generate(edited, ["Fence.remove"])}
    assert before == after


def test_in_region_mutants_carry_their_region_and_covering_tests() -> None:
    regions = resolve_regions(SOURCE, REGIONS, filename="fence.py")
    lines_to_tests = {8: ("t::a",), 16: ("t::b",), 17: ("t::b", "t::c")}
    mutant_set = build_mutants(SOURCE, "fence.py", regions, lines_to_tests)
    by_region = {m.region for m in mutant_set.mutants}
    assert by_region == {"population", "removal"}
    covered = {m.line: m.covered_by for m in mutant_set.mutants}
    assert covered[8] == ("t::a",)  # `block == 0` mutated: the test that ran line 8
    assert covered[9] == ()  # `continue` -> `break`: no test ran line 9
    assert covered[16] == ("t::b",)  # `not jobs` -> `jobs`
    for mutant in mutant_set.mutants:
        assert mutant.diff.startswith("--- a/fence.py\n+++ b/fence.py\n")
    outside = {o.function for o in mutant_set.out_of_region}
    assert outside == {"Fence.register", "Fence.remove"}  # e.g. the loops and the calls


def test_each_diff_is_difflib_s_over_the_whole_texts() -> None:
    """A mutant's diff is computed on its lines near the change, from the original's
    lines with the edits applied; it reads as difflib's over both whole files."""
    regions = resolve_regions(SOURCE, REGIONS, filename="fence.py")
    mutant_set = build_mutants(SOURCE, "fence.py", regions, {})
    assert mutant_set.mutants
    for mutant in mutant_set.mutants:
        whole = difflib.unified_diff(
            SOURCE.splitlines(keepends=True),
            apply_edits(SOURCE, mutant.edits).splitlines(keepends=True),
            "a/fence.py",
            "b/fence.py",
            n=2,
        )
        assert mutant.diff == "".join(whole)


@pytest.mark.parametrize(
    "edits",
    [
        (LineEdit(1, 1, ("first",)),),  # the first line
        (LineEdit(4, 5, ()),),  # the last two lines deleted
        (LineEdit(6, 5, ("appended",)),),  # inserted after the end
        (LineEdit(2, 1, ("inserted",)), LineEdit(4, 4, ("d",))),  # two edits
        (LineEdit(3, 3, ("c",)),),  # a line replaced by itself: no change
    ],
)
def test_a_diff_told_the_edits_is_the_diff_of_the_whole_texts(edits) -> None:  # type: ignore[no-untyped-def]
    original = ["a\n", "b\n", "c\n", "d\n", "e\n"]
    mutated = edited_lines(original, edits)
    whole = "".join(difflib.unified_diff(original, mutated, "a/f.py", "b/f.py", n=2))
    assert unified_diff(original, mutated, "f.py", edits=edits) == whole
    assert unified_diff(original, mutated, "f.py") == whole


def test_an_edit_s_line_holding_a_break_is_split_as_the_text_would_be() -> None:
    edit = LineEdit(2, 2, ("a = 1\x0cb = 2",))
    lines = ["x\n", "y\n", "z\n"]
    edited = edited_lines(lines, (edit,))
    assert edited == "".join(edited).splitlines(keepends=True)
    assert "".join(edited) == apply_edits("".join(lines), (edit,))
    assert edited[0] is lines[0]
    assert lines == ["x\n", "y\n", "z\n"]


def test_function_hashes_ignore_edits_outside_the_function() -> None:
    names = ["Fence.register", "Fence.remove"]
    before = function_hashes(SOURCE, names)
    after = function_hashes(SOURCE.replace("jobs.discard(job)", "jobs.remove(job)"), names)
    assert before["Fence.register"] == after["Fence.register"]
    assert before["Fence.remove"] != after["Fence.remove"]


def test_activation_swaps_the_code_of_one_live_function() -> None:
    module = types.ModuleType("toy_fence_for_activation")
    exec(compile(SOURCE, "fence.py", "exec"), module.__dict__)
    import sys

    sys.modules[module.__name__] = module
    try:
        fence = module.Fence()
        fence.pending = {}
        mutated = SOURCE.replace("if block == 0:", "if block != 0:")
        codeswap.activate(module.__name__, "fence.py", "Fence.register", mutated)
        fence.register(1, [0, 5])  # an instance made before the swap sees it too
        assert fence.pending == {0: {1}}
    finally:
        del sys.modules[module.__name__]


def test_activation_names_a_function_the_mutated_text_lacks() -> None:
    code = compile(SOURCE, "fence.py", "exec")
    with pytest.raises(LookupError, match=r"Fence\.flush"):
        codeswap.find_code(code, "Fence.flush")


def test_a_changed_line_inside_a_multi_line_condition_finds_its_tests() -> None:
    """Coverage records ``if (`` + a split condition on the condition's first line,
    not the header; a change on any line of the statement finds the tests."""
    source = "def f(x, s):\n    if (\n        x\n        in s\n    ):\n        return 1\n"
    tests_of = TestsOfLines(source, "f.py", {3: ("t1",), 4: ("t2",), 6: ("t3",)})
    assert tests_of([4]) == ["t1", "t2"]
    assert tests_of([2]) == ["t1", "t2"]
    assert tests_of([6]) == ["t3"]
    assert tests_of([1]) == []


def test_cached_generation_is_generation(tmp_path) -> None:
    """Per function, by its text: the same mutations, cold, warm, and after a move."""
    functions = ["Fence.register", "Fence.remove"]
    expected = mutmut_adapter.generate(SOURCE, functions)
    cache = tmp_path / "mutations"
    assert generation.generate_cached(SOURCE, functions, cache) == expected
    assert len(list(cache.glob("*.json"))) == 2
    assert generation.generate_cached(SOURCE, functions, cache) == expected
    assert generation.generate_cached(SOURCE, functions, None) == expected
    moved = "import os\n\n\n" + SOURCE
    assert generation.generate_cached(moved, functions, cache) == mutmut_adapter.generate(
        moved, functions
    )
    assert len(list(cache.glob("*.json"))) == 2  # the same texts: nothing new kept


def test_a_damaged_cached_function_is_made_again(tmp_path) -> None:
    cache = tmp_path / "mutations"
    expected = generation.generate_cached(SOURCE, ["Fence.remove"], cache)
    (kept,) = cache.glob("*.json")
    kept.write_text('[{"function": 3}]')
    assert generation.generate_cached(SOURCE, ["Fence.remove"], cache) == expected
    assert generation.generate_cached(SOURCE, ["Fence.remove"], cache) == expected


def test_pull_request_mode_keeps_only_the_mutations_near_the_changed_lines(tmp_path) -> None:
    near = {14}  # jobs.discard(job)
    cached = generation.generate_cached(SOURCE, ["Fence.remove"], tmp_path, near)
    assert cached == mutmut_adapter.generate(SOURCE, ["Fence.remove"], near)
    assert cached
    assert all(m.line - 1 <= 14 <= m.end_line + 1 for m in cached)
