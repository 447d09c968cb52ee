"""The releases page: the audit of each vLLM release, side by side.

``nox -s releases`` audits every release into ``reports/releases/VERSION/`` (each in
its own lean environment) and then calls :func:`write_pages`, which reads each
release's ``audit.json`` back (validated, every tally recomputed, as ``fence-audit
report`` does) and writes ``index.html``, ``releases.json`` and ``releases.md`` beside
them. A release whose audit did not finish has no ``audit.json``: its row says why,
from the ``status.json`` the nox session writes (the exit code).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, replace
from html import escape
from pathlib import Path

from audit.core.errors import AuditError, ConfigError, ExitCode
from audit.core.files import write_text
from audit.core.protocol import is_project_test
from audit.rendering.html_report import CSS
from audit.results import standing
from audit.results.report_model import load_results
from audit.results.view import AuditResults
from audit.setup.model import percent_text
from audit.setup.values import release_key

STATUS_FILE = "status.json"  # {"exit_code": N} of the release's audit, by nox -s releases
PAGES = ("index.html", "releases.json", "releases.md")


@dataclass(frozen=True, slots=True)
class RegionRow:
    score: float | None
    vllm_score: float | None
    judged: int
    absent: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReleaseRow:
    version: str
    state: str  # "complete", "incomplete", or what stopped the audit
    score: float | None = None
    vllm_score: float | None = None
    killed: int = 0
    judged: int = 0
    survived: tuple[str, ...] = ()
    regions: dict[str, RegionRow] = field(default_factory=dict)
    vllm_tests: int = 0  # vLLM's own tests in the baseline
    vllm_fence_tests: tuple[str, ...] = ()  # of those, the ones named for the fence
    catalogue: dict[str, int] = field(default_factory=dict)  # applied, stale, ...
    carried: tuple[str, ...] = ()  # catalogue bugs this release has
    findings: tuple[dict[str, str], ...] = ()  # real vLLM bugs this project's tests found
    duration_s: float = 0.0
    # since the release's recorded standing: "unchanged", "better", "worse", or "" (none)
    standing: str = ""
    standing_notes: tuple[str, ...] = ()  # what got worse or better, one sentence each


def collect(folder: Path, standings: Path | None = None) -> list[ReleaseRow]:
    """One row per ``folder/VERSION/``, oldest release first; with ``standings``, each
    compared with its release's recorded standing there."""
    rows = [
        _row(path, standings)
        for path in folder.iterdir()
        if release_key(path.name) and path.is_dir()
    ]
    return sorted(rows, key=lambda row: release_key(row.version) or ())


def _with_standing(row: ReleaseRow, results: AuditResults, standings: Path | None) -> ReleaseRow:
    if standings is None or row.state != "complete":
        return row
    recorded = standing.path_for(standings, row.version)
    if not recorded.is_file():
        return replace(row, standing="no standing")
    accepted = standing.load(recorded)
    comparison = standing.compare(accepted, results)
    notes = tuple(f"worse: {w}" for w in comparison.worse)
    notes += tuple(f"better: {b}" for b in comparison.better)
    notes += tuple(
        f"accepted alive: {mutant} ({accepted.alive[mutant]['reason']})"
        for mutant in comparison.unchanged_alive
    )
    return replace(row, standing=comparison.state, standing_notes=notes)


def _row(folder: Path, standings: Path | None) -> ReleaseRow:
    results_file = folder / "audit.json"
    if not results_file.is_file():
        return ReleaseRow(folder.name, _why_missing(folder))
    try:
        results = load_results(results_file)
    except AuditError as error:
        return ReleaseRow(folder.name, f"unreadable audit.json: {error.summary}")
    tests = json.loads(results_file.read_text(encoding="utf-8")).get("tests", [])
    vllm_tests = [t for t in tests if isinstance(t, str) and not is_project_test(t)]
    row = ReleaseRow(
        version=results.vllm_version,
        state="incomplete" if results.incomplete else "complete",
        score=results.overall.score,
        vllm_score=results.vllm_score,
        killed=results.overall.killed,
        judged=results.overall.judged,
        survived=tuple(m.id for m in results.survivors()),
        regions={
            r.name: RegionRow(r.tally.score, r.vllm_score, r.tally.judged, r.absent)
            for r in results.regions
        },
        vllm_tests=len(vllm_tests),
        vllm_fence_tests=tuple(t for t in vllm_tests if "fence" in t.rpartition("::")[2]),
        catalogue=_catalogue_counts(results),
        carried=tuple(c.id for c in results.carried()),
        findings=tuple(
            {"id": f.id, "title": f.title, "doc": f.doc, "tests": ", ".join(f.tests)}
            for f in results.findings
        ),
        duration_s=results.duration_s,
    )
    return _with_standing(row, results, standings)


def _why_missing(folder: Path) -> str:
    status = folder / STATUS_FILE
    try:
        code = int(json.loads(status.read_text(encoding="utf-8"))["exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        return "not audited"
    try:
        meaning = ExitCode(code).name.lower().replace("_", " ")
    except ValueError:
        meaning = "failed"
    return f"audit stopped: {meaning} (exit {code})"


def _catalogue_counts(results: AuditResults) -> dict[str, int]:
    counts = {"applied": 0, "stale": 0, "carried": 0, "not yet": 0}
    for entry in results.catalogue:
        counts[entry.state] = counts.get(entry.state, 0) + 1
    return counts


def write_pages(folder: Path, standings: Path | None = None) -> list[Path]:
    """Write the three pages over the releases found in ``folder``; return their paths."""
    rows = collect(folder, standings)
    if not rows:
        raise ConfigError(
            "no release audit found",
            details={
                "folder": str(folder),
                "next": "run `nox -s releases` (it audits into reports/releases/VERSION)",
            },
        )
    texts = {
        "index.html": render_html(rows),
        "releases.json": json.dumps([asdict(row) for row in rows], indent=2) + "\n",
        "releases.md": render_markdown(rows),
    }
    for name, text in texts.items():
        write_text(folder / name, text)
    return [folder / name for name in PAGES]


def _regions(rows: list[ReleaseRow]) -> list[str]:
    return list(dict.fromkeys(name for row in rows for name in row.regions))


def _catalogue_text(row: ReleaseRow) -> str:
    c = row.catalogue
    if not c:
        return ""
    return ", ".join(f"{c[state]} {state}" for state in ("applied", "stale", "carried", "not yet"))


def render_markdown(rows: list[ReleaseRow]) -> str:
    regions = _regions(rows)
    lines = [
        "## fence-audit across vLLM releases",
        "",
        "| release | score | vLLM alone | "
        + " | ".join(regions)
        + " | vLLM fence tests | catalogue | findings | since its standing |",
        "|---|--:|--:|" + "--:|" * len(regions) + "--:|---|---|---|",
    ]
    for row in rows:
        if row.state not in ("complete", "incomplete"):
            lines.append(f"| {row.version} | {row.state} |" + " |" * (len(regions) + 5))
            continue
        per_region = [
            percent_text(row.regions[r].score) if r in row.regions else "" for r in regions
        ]
        score = percent_text(row.score) + (" (incomplete)" if row.state == "incomplete" else "")
        findings = ", ".join(f"{f['id']} (`{f['doc']}`)" for f in row.findings) or "none"
        lines.append(
            f"| {row.version} | {score} of {row.judged} | {percent_text(row.vllm_score)} | "
            + " | ".join(per_region)
            + f" | {len(row.vllm_fence_tests)} of {row.vllm_tests} | {_catalogue_text(row)}"
            + f" | {findings} | {_standing_text(row)} |"
        )
    carried = [(row.version, c) for row in rows for c in row.carried]
    if carried:
        lines += ["", "Catalogue bugs a release carries (the release already has that code):", ""]
        lines += [f"- {version}: `{entry}`" for version, entry in carried]
    absent = [
        (row.version, name, part)
        for row in rows
        for name, region in row.regions.items()
        for part in region.absent
    ]
    if absent:
        lines += ["", "Region parts a release does not have yet:", ""]
        lines += [f"- {version}, {name}: {part}" for version, name, part in absent]
    return "\n".join(lines) + "\n"


def _standing_text(row: ReleaseRow) -> str:
    if not row.standing:
        return ""
    # each note says what it is: "worse:", "better:" or "accepted alive:"
    if not row.standing_notes:
        return row.standing
    return f"{row.standing}; " + "; ".join(row.standing_notes)


def render_html(rows: list[ReleaseRow]) -> str:
    regions = _regions(rows)
    head = "".join(f"<th class=num>{escape(r)}</th>" for r in regions)
    body = []
    for row in rows:
        link = f'<a href="{escape(row.version)}/index.html">{escape(row.version)}</a>'
        if row.state not in ("complete", "incomplete"):
            body.append(
                f"<tr><td>{escape(row.version)}</td>"
                f'<td colspan="{len(regions) + 7}">{escape(row.state)}</td></tr>'
            )
            continue
        cells = "".join(
            f'<td class="num">{percent_text(row.regions[r].score) if r in row.regions else ""}'
            + (
                f' <em title="{escape("; ".join(row.regions[r].absent))}">(part absent)</em>'
                if r in row.regions and row.regions[r].absent
                else ""
            )
            + "</td>"
            for r in regions
        )
        findings = ", ".join(
            f'<span title="{escape(f["title"])}: {escape(f["doc"])}">{escape(f["id"])}</span>'
            for f in row.findings
        )
        incomplete = " <em>(incomplete)</em>" if row.state == "incomplete" else ""
        body.append(
            f"<tr><td>{link}</td>"
            f'<td class="num"><strong>{percent_text(row.score)}</strong> of {row.judged}'
            f"{incomplete}</td>"
            f'<td class="num">{percent_text(row.vllm_score)}</td>{cells}'
            f'<td class="num" title="{escape(", ".join(row.vllm_fence_tests))}">'
            f"{len(row.vllm_fence_tests)} of {row.vllm_tests}</td>"
            f"<td>{escape(_catalogue_text(row))}"
            + (f"<br>carried: {escape(', '.join(row.carried))}" if row.carried else "")
            + f"</td><td>{findings or 'none'}</td>"
            + f'<td class="standing-{escape(row.standing or "none")}">'
            + f"{escape(_standing_text(row))}</td></tr>"
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>fence-audit: vLLM releases</title>"
        f"<style>{CSS}</style></head><body>"
        "<h1>fence-audit across vLLM releases</h1>"
        "<p>Each release audited in its own lean environment, with vLLM's fence tests of "
        "that release and this project's suite. vLLM alone: the score of vLLM's own tests. "
        "vLLM fence tests: vLLM's tests named for the fence, of all of vLLM's tests run.</p>"
        + _chart(rows)
        + "<table id=releases><thead><tr><th>release</th><th class=num>score</th>"
        f"<th class=num>vLLM alone</th>{head}<th class=num>vLLM fence tests</th>"
        "<th>catalogue</th><th>findings</th><th>since its standing</th></tr></thead><tbody>"
        + "".join(body)
        + "</tbody></table></body></html>\n"
    )


def _chart(rows: list[ReleaseRow]) -> str:
    """An inline SVG: the score and vLLM's alone, by release (no script, no library)."""
    scored = [row for row in rows if row.score is not None]
    if not scored:
        return ""
    width, height, pad = 120 + 90 * len(scored), 220, 40
    step = (width - 2 * pad) / max(1, len(scored) - 1) if len(scored) > 1 else 0

    def y(value: float | None) -> float:
        return height - pad - (height - 2 * pad) * (value or 0) / 100

    def line(values: list[float | None], colour: str, name: str) -> str:
        points = " ".join(f"{pad + i * step:.1f},{y(v):.1f}" for i, v in enumerate(values))
        dots = "".join(
            f'<circle cx="{pad + i * step:.1f}" cy="{y(v):.1f}" r="4" fill="{colour}">'
            f"<title>{name}: {percent_text(v)}</title></circle>"
            for i, v in enumerate(values)
        )
        return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>{dots}'

    labels = "".join(
        f'<text x="{pad + i * step:.1f}" y="{height - pad + 18}" text-anchor="middle">'
        f"{escape(row.version)}</text>"
        for i, row in enumerate(scored)
    )
    grid = "".join(
        f'<line x1="{pad}" x2="{width - pad}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
        f'<text x="{pad - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}%</text>'
        for v in (0, 25, 50, 75, 100)
    )
    return (
        f'<svg id="score-chart" role="img" aria-label="score by release" width="{width}" '
        f'height="{height}" font-size="12">{grid}{labels}'
        + line([row.score for row in scored], "#2e7d32", "score")
        + line([row.vllm_score for row in scored], "#1565c0", "vLLM alone")
        + f'<text x="{width - pad}" y="16" text-anchor="end" fill="#2e7d32">score</text>'
        + f'<text x="{width - pad}" y="32" text-anchor="end" fill="#1565c0">vLLM alone</text>'
        + "</svg>"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m audit.rendering.releases [FOLDER] [--standings DIR]``: write the releases pages
    over FOLDER, each release compared with its standing in DIR when given."""
    args = list(sys.argv[1:] if argv is None else argv)
    standings = None
    if "--standings" in args:
        at = args.index("--standings")
        standings = Path(args[at + 1]) if at + 1 < len(args) else None
        del args[at : at + 2]
    folder = Path(args[0] if args else "reports/releases")
    try:
        written = write_pages(folder, standings)
    except AuditError as error:
        print(error.render(), file=sys.stderr)
        return int(error.exit_code)
    print(f"fence-audit: the releases page is {written[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
