"""The benchmark's account of disagreements with mutmut (audit/devtools/bench.py): each named,
those after hung tests said so, and mutmut's own confirmation reported only when
mutmut gave it, and ours' replay of each in mutmut's order."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from audit.devtools.bench import Bench, format_bench, write_bench

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
HANGS_REPLAYED = (("f:a@1", "timeout"), ("f:b@2", "timeout"))  # ours in mutmut's order


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


def test_ours_in_mutmut_s_order_is_said_of_each_disagreement(tmp_path: Path) -> None:
    """Ours replays each disagreement in mutmut's order: a status equal to mutmut's
    reproduces it, another does not, and a mutant mutmut's stats gave no test is
    said so; only when every one is reproduced does the bench say so."""
    bench = dataclasses.replace(
        after_hangs("f:a@1", "f:b@2"),
        disagreements=(*HANGS, ("f:c@3", "survived", "killed")),
        in_mutmut_order=(("f:a@1", "timeout"), ("f:b@2", "killed"), ("f:c@3", "")),
    )
    assert bench.reproduced_in_mutmut_order == ("f:a@1",)
    lines = format_bench(bench).splitlines()
    line = {i: next(text for text in lines if i in text) for i in ("f:a@1", "f:b@2", "f:c@3")}
    assert line["f:a@1"].endswith("ours says timeout in mutmut's order, stopping as mutmut stops)")
    assert "ours says killed in mutmut's order" in line["f:b@2"]
    assert line["f:c@3"].endswith("(mutmut's stats give it no test)")
    assert not any("reproduced by ours" in text for text in lines)
    document = write_bench(bench, tmp_path / "bench.json")
    assert document["in_mutmut_order"] == {"f:a@1": "timeout", "f:b@2": "killed", "f:c@3": ""}
    assert document["reproduced_in_mutmut_order"] == ["f:a@1"]

    every = dataclasses.replace(bench, disagreements=HANGS, in_mutmut_order=HANGS_REPLAYED)
    assert every.reproduced_in_mutmut_order == ("f:a@1", "f:b@2")
    assert format_bench(every).count("every disagreement reproduced by ours in mutmut's order") == 1


def test_mutmut_s_second_run_of_each_disagreement_is_said(tmp_path: Path) -> None:
    """mutmut judges each disagreement again in a run of its own: the same status is
    said as a repeat, another one as what the second run says."""
    bench = dataclasses.replace(
        after_hangs("f:a@1", "f:b@2"), mutmut_again=(("f:a@1", "timeout"), ("f:b@2", "killed"))
    )
    lines = format_bench(bench).splitlines()
    first = next(line for line in lines if "f:a@1" in line)
    second = next(line for line in lines if "f:b@2" in line)
    assert first.endswith("; mutmut says timeout again, alone)")
    assert second.endswith("; mutmut, run again alone, says killed)")
    document = write_bench(bench, tmp_path / "bench.json")
    assert document["mutmut_again"] == {"f:a@1": "timeout", "f:b@2": "killed"}


def test_every_mutant_in_mutmut_s_order_is_a_second_comparison(tmp_path: Path) -> None:
    """Ours judged every mutant again in mutmut's order: agreement there is said apart
    from the first comparison's, each difference is named, one mutmut's stats gave no
    test among them, and no run at all is not agreement."""
    assert not AGREED.statuses_agree_in_mutmut_order  # that run was not made
    assert "in mutmut's order" not in format_bench(AGREED)

    agreed = dataclasses.replace(after_hangs("f:a@1", "f:b@2"), in_order_s=40.0)
    assert agreed.statuses_agree_in_mutmut_order
    text = format_bench(agreed)
    assert "statuses agree            False" in text
    assert "  statuses agree so       True" in text
    assert "mutmut / that = 2.5" in text  # 100 / 40
    document = write_bench(agreed, tmp_path / "bench.json")
    assert document["statuses_agree_in_mutmut_order"] is True
    assert document["ratios"]["mutmut_over_ours_in_order"] == 2.5

    differs = dataclasses.replace(
        agreed,
        in_order_disagreements=(("f:a@1", "killed", "timeout"), ("f:d@4", "", "no_tests")),
    )
    assert not differs.statuses_agree_in_mutmut_order
    lines = format_bench(differs).splitlines()
    assert "  statuses agree so       False" in lines
    assert "  f:a@1: ours in that order killed, mutmut timeout" in lines
    assert (
        "  f:d@4: ours in that order not judged (mutmut's stats give it no test), mutmut no_tests"
        in lines
    )
    document = write_bench(differs, tmp_path / "bench.json")
    assert document["in_order_disagreements"][1] == {
        "id": "f:d@4",
        "ours_in_mutmut_order": "",
        "mutmut": "no_tests",
    }
