"""Only a verdict is ever cached: an interrupted judging, or a damaged verdict file, is
judged again; a catalogue entry outside its region is never judged into its score."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from fence_helpers import fence_audit
from test_toy_mutation import Toy, toy  # noqa: F401  (the fixture)

from audit.core.protocol import MutantStatus
from audit.mutation.catalogue_entries import load_catalogue
from audit.mutation.catalogue_mutants import build_catalogue_mutants
from audit.setup.region_specs import RegionSpec, Selection
from audit.setup.regions import resolve_regions

INTERRUPTING_TEST = """\
import os
import signal

from toypkg.fence import Fence

ORIGINAL = Fence.register.__code__


def test_register_is_interrupted_while_a_mutant_of_it_is_judged():
    Fence().register(1, [1, 2])
    if Fence.register.__code__ is not ORIGINAL:  # in a judging fork, the mutant on
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C reaches the process group
"""


def test_an_interrupted_judging_is_never_cached(toy: Toy) -> None:  # noqa: F811
    (toy.root / "tests" / "test_interrupt.py").write_text(INTERRUPTING_TEST)
    mutant_set, first = toy.judge("tests/test_interrupt.py")
    register = [m for m in mutant_set.mutants if m.function == "Fence.register" and m.covered_by]
    assert register
    interrupted = [m for m in register if first[m.id].status is not MutantStatus.KILLED]
    assert interrupted  # the others break register before the interrupt: killed
    for mutant in interrupted:
        assert first[mutant.id].status is MutantStatus.ERROR
        assert "ended without a verdict (exit status 130)" in first[mutant.id].failure
    cached = list((toy.config.cache_dir / "results").glob("*.json"))
    assert len(cached) == len(register) - len(interrupted)  # the kills only
    _, second = toy.judge("tests/test_interrupt.py")
    assert not any(second[m.id].cached for m in interrupted)  # judged again, not reused
    assert all(second[m.id].cached for m in register if m not in interrupted)


def test_a_damaged_verdict_file_is_judged_again(toy: Toy) -> None:  # noqa: F811
    mutant_set, first = toy.judge()
    files = sorted((toy.config.cache_dir / "results").glob("*.json"))
    assert files
    for index, path in enumerate(files):  # a cut-off file, and valid JSON of another shape
        path.write_text('{"status": "kil' if index % 2 else '{"status": "maimed"}')
    _, second = toy.judge()
    judged = [m for m in mutant_set.mutants if m.covered_by]
    assert {m.id: second[m.id].status for m in judged} == {m.id: first[m.id].status for m in judged}
    assert not any(second[m.id].cached for m in judged)
    _, third = toy.judge()
    kept = [m for m in judged if third[m.id].status is not MutantStatus.TIMEOUT]
    assert kept
    assert all(third[m.id].cached for m in kept)  # and rewritten whole (a timeout: judged again)


SOURCE = textwrap.dedent(
    """\
    class Fence:
        def remove(self, job):
            del self.pending[job]

        def next_id(self):
            self.count += 1
            return self.count
    """
)


def write_entry_outside_removal(folder: Path, entry_id: str, function: str, counter: str) -> None:
    """A catalogue entry of region removal that steps ``counter`` by two in ``function``."""
    (folder / f"{entry_id}.toml").write_text(
        textwrap.dedent(
            f"""\
            format = 1
            id = "{entry_id}"
            region = "removal"
            title = "the counter steps by two"
            bug = "an edit to a function no region holds"
            invariant = "I7"
            symptom = "none the removal region's tests could see"
            expected = "project"

            [[change]]
            function = "{function}"
            statement = "{counter} += 1"
            action = "replace"
            new = "{counter} += 2"
            """
        )
    )


def test_a_catalogue_entry_outside_its_region_is_stale_not_judged(tmp_path: Path) -> None:
    write_entry_outside_removal(tmp_path, "outside", "Fence.next_id", "self.count")
    entries = load_catalogue(tmp_path)
    regions = resolve_regions(
        SOURCE, (RegionSpec("removal", "", (Selection("Fence.remove"),)),), filename="fence.py"
    )
    built = build_catalogue_mutants(entries, SOURCE, "fence.py", regions, {5: ("t::a",)})
    assert built.mutants == ()
    (stale,) = built.stale
    assert "Fence.next_id, which is not in region removal (Fence.remove)" in stale.reason


@pytest.mark.vllm
def test_catalogue_check_names_an_entry_outside_its_region(tmp_path: Path) -> None:
    folder = tmp_path / "catalogue"
    folder.mkdir()
    write_entry_outside_removal(
        folder,
        "removal-job-ids-step-twice",
        "OffloadingConnectorScheduler._generate_job_id",
        "self._job_counter",
    )
    (tmp_path / "pyproject.toml").write_text(f'[tool.fence-audit]\ncatalogue = "{folder}"\n')
    result = fence_audit(
        "catalogue", "check", "--config", str(tmp_path / "pyproject.toml"), cwd=tmp_path
    )
    assert result.returncode == 12, result.stderr
    assert "_generate_job_id, which is not in region removal" in result.stdout
