"""The benchmark's account of disagreements with mutmut (audit/bench.py): each named,
those after hung tests said so, and mutmut's own confirmation reported only when
mutmut gave it."""

from __future__ import annotations

import dataclasses

from audit.bench import Bench, format_bench

AGREED = Bench(
    mutants=3,
    jobs=2,
    generation_s=1.0,
    baseline_s=10.0,
    ours_s=20.0,
    ours_cold_s=30.0,
    mutmut_s=100.0,
    floor_s=15.0,
    vllm_import_s=6.0,
    subprocess_s_per_mutant=11.0,
    subprocess_sample=3,
    statuses_agree=True,
    disagreements=(),
    ours_e2e_s=32.0,
    ours_e2e_runs_s=(31.0, 33.0),
    noop_s=1.5,
)
HANGS = (("f:a@1", "killed", "timeout"), ("f:b@2", "killed", "timeout"))


def after_hangs(*confirmed: str) -> Bench:
    """Two disagreements after hung tests, of which mutmut confirmed ``confirmed``."""
    return dataclasses.replace(
        AGREED,
        statuses_agree=False,
        disagreements=HANGS,
        killed_after_hangs=("f:a@1", "f:b@2"),
        confirmed_by_mutmut=confirmed,
    )


def test_no_disagreement_is_trivially_confirmed_and_says_nothing_more() -> None:
    assert AGREED.disagreements_confirmed
    text = format_bench(AGREED)
    assert "statuses agree            True" in text
    assert "confirmed" not in text
    assert "the mean of 31.0 s before mutmut's run and 33.0 s after" in text
    assert "mutmut / that = 3.12" in text  # 100 / 32


def test_a_disagreement_mutmut_did_not_confirm_leaves_them_unconfirmed() -> None:
    bench = after_hangs("f:a@1")
    assert not bench.disagreements_confirmed
    lines = format_bench(bench).splitlines()
    first = next(line for line in lines if "f:a@1" in line)
    second = next(line for line in lines if "f:b@2" in line)
    assert first.endswith("mutmut kills it running our killing test alone)")
    assert second.endswith("(ours after hung tests: mutmut stops at a hang)")
    assert not any("every disagreement confirmed" in line for line in lines)


def test_every_disagreement_confirmed_is_said_once() -> None:
    bench = after_hangs("f:a@1", "f:b@2")
    assert bench.disagreements_confirmed
    text = format_bench(bench)
    assert "statuses agree            False" in text
    assert text.count("every disagreement confirmed by mutmut itself") == 1


def test_a_kill_without_hangs_that_mutmut_confirms_is_said_so() -> None:
    """Ours ran the killer first; mutmut ran a test that hangs first: no hung test in
    ours, and mutmut's own runner kills it with our killer alone."""
    bench = dataclasses.replace(
        AGREED,
        statuses_agree=False,
        disagreements=(("f:c@3", "killed", "timeout"),),
        confirmed_by_mutmut=("f:c@3",),
    )
    lines = format_bench(bench).splitlines()
    line = next(line for line in lines if "f:c@3" in line)
    assert line.endswith(
        "ours killed, mutmut timeout (mutmut kills it running our killing test alone)"
    )
    assert "  every disagreement confirmed by mutmut itself" in lines
