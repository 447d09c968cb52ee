"""The README's first screen: its two commands, and its tables equal to their sources.

The releases table is drawn from the releases' recorded standings
(``locks/standings/``, written by ``fence-audit accept``); the findings table from the
registry (``docs/findings.toml``). A test here fails, and prints the table the README
should hold, when either changes and the README does not.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from audit.setup.model import Fraction, percent_text
from audit.setup.values import release_key

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
STANDINGS = ROOT / "locks" / "standings"


def releases_table() -> str:
    """Newest release first: its score, vLLM's suite alone, its registered findings."""
    rows = ["| vLLM | score | vLLM's suite alone | findings |", "|---|--:|--:|--:|"]
    standings = [json.loads(p.read_text()) for p in STANDINGS.glob("vllm-*.json")]
    standings.sort(key=lambda s: release_key(s["vllm_version"]) or (), reverse=True)
    for standing in standings:
        score = standing["score"]
        killed, judged, alone = score["killed"], score["judged"], score["killed_by_vllm"]
        rows.append(
            f"| {standing['vllm_version']} "
            f"| {percent_text(Fraction(killed, judged).percent)} of {judged} "
            f"| {percent_text(Fraction(alone, judged).percent)} "
            f"| {len(standing['findings'])} |"
        )
    return "\n".join(rows)


def findings_table() -> str:
    """Each registered finding: its effect, the releases that have it, its write-up."""
    registry = tomllib.loads((ROOT / "docs" / "findings.toml").read_text())["finding"]
    locked = sorted(
        (
            p.name.removeprefix("vllm-").removesuffix(".txt")
            for p in (ROOT / "locks").glob("vllm-*.txt")
        ),
        key=lambda v: release_key(v) or (),
    )
    rows = ["| finding | effect | vLLM releases | write-up |", "|---|---|---|---|"]
    for finding in registry:
        doc = finding["doc"]
        rows.append(
            f"| `{finding['id']}`: {finding['title']} | {finding['effect']} "
            f"| {_span(finding['releases'], locked)} | [{Path(doc).name}]({doc}) |"
        )
    return "\n".join(rows)


def _span(releases: list[str], locked: list[str]) -> str:
    """``0.28.0-0.32.0`` for a run of consecutive locked releases, else each one."""
    ordered = sorted(releases, key=lambda v: release_key(v) or ())
    if all(v in locked for v in ordered):
        first = locked.index(ordered[0])
        if locked[first : first + len(ordered)] == ordered:
            return ordered[0] if len(ordered) == 1 else f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(ordered)


def test_the_two_commands_are_on_the_first_screen() -> None:
    first = README.read_text().splitlines()[:30]
    assert (
        "    pip install nox && nox -s audit     # audit vLLM 0.34.0: reports/index.html" in first
    )
    assert "    pip install nox && nox -s tests     # run fence-audit's own tests" in first
    assert any(line.startswith("![") and "docs/report.png" in line for line in first)
    assert (ROOT / "docs" / "report.png").is_file()


def test_the_releases_table_is_the_standings() -> None:
    table = releases_table()
    assert table.count("\n") >= 2, "no standing recorded in locks/standings"
    first = "\n".join(README.read_text().splitlines()[:30])
    assert table in first, f"README.md's first screen should hold:\n{table}"


def test_the_findings_table_is_the_registry() -> None:
    table = findings_table()
    assert table in README.read_text(), f"README.md should hold:\n{table}"
