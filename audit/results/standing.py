"""A release's recorded standing, and a run compared with it: the weekly ratchet.

A standing is what a maintainer accepted of one release's audit: its score and each
region's, which test killed each mutant, the mutants left alive with why each is
accepted, and which registered findings the release has. ``fence-audit accept``
writes it (``locks/standings/vllm-VERSION.json``, reviewed as a diff in a pull
request); CI never writes one. ``fence-audit gate --standing`` compares a run with
its release's standing (:func:`compare`): the run is *worse* when a score fell, a
mutant the standing records as killed is no longer killed, a mutant the standing
does not know survives, or a finding changed state; *better* when a recorded
survivor is now killed (or a score rose) and nothing got worse; else *unchanged*.
A release with no standing is gated by the absolute thresholds, as pull requests are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.core.errors import ConfigError, ResultsIncomplete
from audit.core.files import write_text
from audit.core.protocol import MutantStatus
from audit.results.view import AuditResults
from audit.setup.model import Fraction, percent_text

FORMAT = 1
PROPOSED = "standing-proposed.json"  # a release's first standing, for review (gate --standing)
UNREVIEWED = "not reviewed yet: say why it is accepted, or kill it"
ALIVE = (MutantStatus.SURVIVED, MutantStatus.TIMEOUT, MutantStatus.NO_TESTS, MutantStatus.ERROR)
_KEYS = {"format", "vllm_version", "recorded_from", "score", "regions", "killed", "alive",
         "findings"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Score:
    killed: int
    judged: int
    killed_by_vllm: int

    @property
    def percent(self) -> float | None:
        return Fraction(self.killed, self.judged).percent

    def text(self) -> str:
        return f"{percent_text(self.percent)} ({self.killed} of {self.judged})"


@dataclass(frozen=True, slots=True)
class Standing:
    vllm_version: str
    recorded_from: str  # the accepted run's started_at
    score: Score
    regions: dict[str, Score]
    killed: dict[str, str]  # mutant id -> the test that killed it
    alive: dict[str, dict[str, str]]  # mutant id -> {"status": ..., "reason": ...}
    findings: tuple[str, ...]  # the registered findings the release has

    def to_json(self) -> str:
        document = {
            "format": FORMAT,
            "vllm_version": self.vllm_version,
            "recorded_from": self.recorded_from,
            "score": _score_json(self.score),
            "regions": {name: _score_json(s) for name, s in sorted(self.regions.items())},
            "killed": dict(sorted(self.killed.items())),
            "alive": dict(sorted(self.alive.items())),
            "findings": sorted(self.findings),
        }
        # one line per score and per mutant: a pull request's diff shows each change
        lines = ["{"]
        items = list(document.items())
        for index, (key, value) in enumerate(items):
            comma = "," if index < len(items) - 1 else ""
            if isinstance(value, dict) and key != "score" and value:
                inner = [
                    f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                    for k, v in value.items()
                ]
                lines.append(f" {json.dumps(key)}: {{\n" + ",\n".join(inner) + f"\n }}{comma}")
            else:
                lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
        return "\n".join(lines) + "\n}\n"


def path_for(folder: Path, version: str) -> Path:
    return folder / f"vllm-{version}.json"


def of_results(results: AuditResults, reasons: Mapping[str, str]) -> Standing:
    """The standing ``results`` would record; ``reasons`` says why each mutant left
    alive is accepted (a ConfigError names the first one without a reason)."""
    _check_complete(results)
    alive = {}
    for mutant in results.mutants:
        if mutant.status not in ALIVE:
            continue
        reason = reasons.get(mutant.id, "").strip()
        if not reason:
            raise ConfigError(
                f"{mutant.id} is {mutant.status.value} on vLLM {results.vllm_version}, "
                "and the standing needs a reason to accept it",
                details={
                    "results": str(results.path),
                    "next": f"give --reason '{mutant.id}=WHY', or kill it first",
                },
            )
        alive[mutant.id] = {"status": mutant.status.value, "reason": reason}
    return Standing(
        vllm_version=results.vllm_version,
        recorded_from=results.started_at,
        score=Score(results.overall.killed, results.overall.judged, results.overall_killed_by_vllm),
        regions={
            r.name: Score(r.tally.killed, r.tally.judged, r.killed_by_vllm) for r in results.regions
        },
        killed={m.id: m.killed_by for m in results.mutants if m.status is MutantStatus.KILLED},
        alive=alive,
        findings=tuple(sorted(f.id for f in results.findings)),
    )


def load(path: Path) -> Standing:
    """The standing at ``path``; a ConfigError (exit 1) says what is wrong with it."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _bad(path, f"cannot be read as JSON ({error})") from None
    if not isinstance(document, dict):
        raise _bad(path, "is not a JSON object")
    unknown = sorted(set(document) - _KEYS)
    missing = sorted(_KEYS - set(document))
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise _bad(path, f"has an {what}" if unknown else f"is {what}")
    if document["format"] != FORMAT:
        raise _bad(path, f"is format {document['format']!r}, this fence-audit reads {FORMAT}")
    try:
        return Standing(
            vllm_version=str(document["vllm_version"]),
            recorded_from=str(document["recorded_from"]),
            score=_score(document["score"]),
            regions={str(n): _score(s) for n, s in document["regions"].items()},
            killed={str(k): str(v) for k, v in document["killed"].items()},
            alive={
                str(k): {"status": str(v["status"]), "reason": str(v["reason"])}
                for k, v in document["alive"].items()
            },
            findings=tuple(str(f) for f in document["findings"]),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise _bad(path, f"has a malformed entry ({error!r})") from None


def record(folder: Path, standing: Standing) -> Path:
    path = path_for(folder, standing.vllm_version)
    write_text(path, standing.to_json())
    return path


@dataclass(frozen=True, slots=True)
class Comparison:
    version: str
    worse: tuple[str, ...] = ()  # each way the run is worse, in a sentence
    better: tuple[str, ...] = ()  # each way it is better
    unchanged_alive: tuple[str, ...] = ()  # recorded survivors still alive

    @property
    def state(self) -> str:
        return "worse" if self.worse else "better" if self.better else "unchanged"

    def render(self) -> str:
        head = f"fence-audit: standing of vLLM {self.version}: {self.state}"
        lines = [head]
        lines += [f"fence-audit: standing: worse: {why}" for why in self.worse]
        lines += [f"fence-audit: standing: better: {why}" for why in self.better]
        if self.better and not self.worse:
            lines.append(
                "fence-audit: standing: record it with `fence-audit accept` "
                "and propose the new standing as a pull request"
            )
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [f"### vLLM {self.version}: {self.state} since its standing", ""]
        lines += [f"- worse: {why}" for why in self.worse]
        lines += [f"- better: {why}" for why in self.better]
        if self.unchanged_alive:
            lines.append(f"- accepted survivors still alive: {len(self.unchanged_alive)}")
        return "\n".join(lines) + "\n"


def compare(standing: Standing, results: AuditResults) -> Comparison:
    """How ``results`` differ from ``standing`` (both of one release)."""
    _check_complete(results)
    if results.vllm_version != standing.vllm_version:
        raise ConfigError(
            f"the results are of vLLM {results.vllm_version}, the standing of "
            f"{standing.vllm_version}",
            details={"results": str(results.path), "next": "compare a release with its own"},
        )
    worse: list[str] = []
    better: list[str] = []
    now = Score(results.overall.killed, results.overall.judged, results.overall_killed_by_vllm)
    _scores("the score", standing.score, now, worse, better)
    regions = {r.name: r for r in results.regions}
    for name, recorded in sorted(standing.regions.items()):
        region = regions.get(name)
        if region is None:
            worse.append(f"region {name} is not in the run (recorded {recorded.text()})")
            continue
        current = Score(region.tally.killed, region.tally.judged, region.killed_by_vllm)
        _scores(f"the score of {name}", recorded, current, worse, better)
    still_alive = []
    for mutant in results.mutants:
        status = mutant.status
        if mutant.id in standing.killed and status in ALIVE:
            worse.append(
                f"{mutant.id} is {status.value}; {standing.killed[mutant.id]} killed it "
                "in the standing"
            )
        elif mutant.id in standing.alive:
            if status in ALIVE:
                still_alive.append(mutant.id)
            else:
                better.append(f"{mutant.id} is {status.value} (accepted as alive before)")
        elif mutant.id not in standing.killed and status in ALIVE:
            worse.append(f"{mutant.id} is {status.value}, and the standing does not know it")
    recorded_findings, findings = set(standing.findings), {f.id for f in results.findings}
    worse += [
        f"finding {f} now fails on this release (not in the standing)"
        for f in sorted(findings - recorded_findings)
    ]
    worse += [
        f"finding {f} no longer fails on this release: update docs/findings.toml"
        for f in sorted(recorded_findings - findings)
    ]
    return Comparison(standing.vllm_version, tuple(worse), tuple(better), tuple(still_alive))


def parse_reasons(texts: Sequence[str]) -> dict[str, str]:
    """``--reason ID=WHY`` options as a mapping (a usage error names a malformed one)."""
    reasons = {}
    for text in texts:
        mutant, sep, why = text.partition("=")
        if not sep or not mutant.strip() or not why.strip():
            raise ConfigError(
                f"--reason {text!r} is not of the form MUTANT_ID=WHY",
                details={"next": "for example --reason 'catalogue:some-entry=why it lives'"},
            )
        reasons[mutant.strip()] = why.strip()
    return reasons


def _scores(
    name: str, recorded: Score, current: Score, worse: list[str], better: list[str]
) -> None:
    before, after = recorded.percent, current.percent
    if before is None or after is None:
        return
    if round(after, 2) < round(before, 2):
        worse.append(f"{name} fell from {recorded.text()} to {current.text()}")
    elif round(after, 2) > round(before, 2):
        better.append(f"{name} rose from {recorded.text()} to {current.text()}")


def _check_complete(results: AuditResults) -> None:
    if results.incomplete is not None or results.shard is not None:
        raise ResultsIncomplete(
            "the results are of an interrupted run or one shard: they cannot stand for the release",
            details={"results": str(results.path), "next": "finish or merge the run first"},
        )


def _score_json(score: Score) -> dict[str, int]:
    return {"killed": score.killed, "judged": score.judged, "killed_by_vllm": score.killed_by_vllm}


def _score(value: Any) -> Score:
    return Score(int(value["killed"]), int(value["judged"]), int(value["killed_by_vllm"]))


def _bad(path: Path, what: str) -> ConfigError:
    return ConfigError(
        f"the standing {path.name} {what}",
        details={"file": str(path), "next": "record it again with `fence-audit accept`"},
    )
