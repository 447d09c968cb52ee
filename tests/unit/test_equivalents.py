"""Reviewed equivalent mutants: applied only to current, surviving mutants."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from audit.cli import judged_counts
from audit.core.errors import ConfigError
from audit.core.protocol import MutantStatus
from audit.mutation.equivalents import Equivalent, Site, apply_equivalents, load_equivalents
from audit.setup.model import Mutant, MutantResult


def mutant(identifier: str, function: str = "F.f") -> Mutant:
    return Mutant(
        id=identifier,
        origin="mutmut",
        region="flush",
        function=function,
        operator="swap_op",
        ordinal=0,
        line=1,
        changed_lines=(1,),
        diff="",
        edits=(),
        covered_by=("t",),
    )


def test_each_verdict_gets_a_state_and_only_current_survivors_become_equivalent() -> None:
    mutants = [mutant("a"), mutant("b"), mutant("c", "F.g"), mutant("d"), mutant("e")]
    verdicts = {
        "a": MutantResult("a", MutantStatus.SURVIVED),
        "b": MutantResult("b", MutantStatus.KILLED, killed_by="t"),
        "c": MutantResult("c", MutantStatus.SURVIVED),
        "d": MutantResult("d", MutantStatus.TIMEOUT),
        "e": MutantResult("e", MutantStatus.NO_TESTS),
    }
    hashes = {"F.f": "h1", "F.g": "changed"}
    records = [
        Equivalent("a", "h1", "same behaviour", "today"),
        Equivalent("b", "h1", "wrongly thought equivalent", "today"),
        Equivalent("c", "h-old", "was equivalent before the function changed", "today"),
        Equivalent("d", "h1", "hangs either way", "today"),
        Equivalent("e", "h1", "dead code: no test can reach it", "today"),
        Equivalent("gone", "h1", "a mutant no longer generated", "today"),
    ]
    updated, states = apply_equivalents(mutants, verdicts, hashes, records)
    assert updated["a"].status is MutantStatus.EQUIVALENT
    assert updated["b"].status is MutantStatus.KILLED
    assert updated["c"].status is MutantStatus.SURVIVED
    assert updated["d"].status is MutantStatus.TIMEOUT
    assert updated["e"].status is MutantStatus.EQUIVALENT
    assert [s["state"] for s in states] == [
        "applied",
        "killed",
        "expired",
        "not survived",
        "applied",
        "absent",
    ]


def test_the_projects_equivalents_load_with_reasons(project_root: Path) -> None:
    records = load_equivalents(project_root / "mutants" / "equivalents.toml")
    assert records
    assert all(len(r.reason) > 80 and len(r.function_sha256) == 64 for r in records)


@pytest.mark.parametrize(
    "body",
    [
        '[[equivalent]]\nid = "a"\nreason = "r"\nreviewed = "d"\n',  # no function_sha256
        '[[equivalent]]\nid = "a"\nfunction_sha256 = "h"\nreason = "r"\nreviewed = "d"\nx = 1\n',
        "equivalent = 3\n",
        "[[equivalent]\n",
    ],
)
def test_a_broken_equivalents_file_is_a_config_error(tmp_path: Path, body: str) -> None:
    path = tmp_path / "equivalents.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as error:
        load_equivalents(path)
    assert str(path) in error.value.render()


def test_no_file_means_no_verdicts(tmp_path: Path) -> None:
    assert load_equivalents(tmp_path / "missing.toml") == ()
    assert load_equivalents(None) == ()


def test_a_verdict_follows_the_same_mutation_into_other_releases_code() -> None:
    """One reason, several sites: the one whose id and reviewed source are this run's."""
    verdict = Equivalent(
        "F.f:swap@30#0",
        "h-new",
        "order does not matter",
        "first review",
        also=(
            Site("F.f:swap@26#0", "h-old-1", "on release one"),
            Site("F.f:swap@26#0", "h-old-2", "on release two"),
        ),
    )
    survived = {"F.f:swap@26#0": MutantResult("F.f:swap@26#0", MutantStatus.SURVIVED)}
    for source, state, reviewed in [
        ("h-old-2", "applied", "on release two"),
        ("h-old-1", "applied", "on release one"),
        ("h-changed", "expired", "on release one"),
    ]:
        updated, records = apply_equivalents(
            [mutant("F.f:swap@26#0")], survived, {"F.f": source}, [verdict]
        )
        assert (records[0]["id"], records[0]["state"]) == ("F.f:swap@26#0", state)
        assert records[0]["reviewed"] == reviewed
        expected = MutantStatus.EQUIVALENT if state == "applied" else MutantStatus.SURVIVED
        assert updated["F.f:swap@26#0"].status is expected
    _, records = apply_equivalents([mutant("other")], {}, {"F.f": "h-new"}, [verdict])
    assert (records[0]["id"], records[0]["state"]) == ("F.f:swap@30#0", "absent")


def test_the_also_sites_load_and_reject_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "equivalents.toml"
    record = '[[equivalent]]\nid = "a"\nfunction_sha256 = "h"\nreason = "r"\nreviewed = "d"\n'
    site = '[[equivalent.also]]\nid = "b"\nfunction_sha256 = "g"\n'
    path.write_text(record + site + 'reviewed = "e"\n')
    (loaded,) = load_equivalents(path)
    assert [site.id for site in loaded.sites] == ["a", "b"]
    path.write_text(record + site + 'reason = "r"\n')
    with pytest.raises(ConfigError, match="unknown key"):
        load_equivalents(path)


def test_an_equivalent_no_test_reaches_is_not_counted_as_judged() -> None:
    """A reviewed equivalent of dead code has a verdict, but no test ran for it: the
    run's line counts it among the mutants no test reaches, never as judged."""
    mutants = [mutant("a"), mutant("b"), replace(mutant("dead"), covered_by=())]
    verdicts = {
        "a": MutantResult("a", MutantStatus.KILLED, killed_by="t"),
        "b": MutantResult("b", MutantStatus.SURVIVED, cached=True),
        "dead": MutantResult("dead", MutantStatus.NO_TESTS),
    }
    equivalent = Equivalent("dead", "h1", "dead code: no test can reach it", "today")
    updated, _ = apply_equivalents(mutants, verdicts, {"F.f": "h1"}, [equivalent])
    assert updated["dead"].status is MutantStatus.EQUIVALENT
    assert judged_counts(mutants, updated) == (1, 1, 1)
