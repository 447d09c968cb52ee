"""The HTML report: ``index.html`` and one source page per region, self-contained.

No script, no stylesheet or font from elsewhere: the pages open from an unzipped CI
artifact with no network. Expanding a mutant is a ``<details>`` element. Every
piece of text that comes from the run (test ids, failure messages, source lines,
diffs) goes through :func:`html.escape`: it is shown as text, never read as markup.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable

from audit import __version__
from audit.core.protocol import MutantStatus
from audit.core.text import visible
from audit.judging import deep
from audit.mutation.scope import APART
from audit.results.report_model import (
    STATUS_ORDER,
    AuditResults,
    FunctionTally,
    MutantRecord,
    RegionResult,
    SecondJudgement,
    SourceFunction,
    SourceLine,
)
from audit.results.scores import Tally
from audit.setup.model import fraction_text, percent_text

STATUS_COLOURS = {
    MutantStatus.KILLED: "#2e7d32",
    MutantStatus.SURVIVED: "#c62828",
    MutantStatus.TIMEOUT: "#ef6c00",
    MutantStatus.NO_TESTS: "#9e9e9e",
    MutantStatus.ERROR: "#6a1b9a",
    MutantStatus.EQUIVALENT: "#1565c0",
}
STATUS_LABELS = {
    MutantStatus.KILLED: "killed",
    MutantStatus.SURVIVED: "survived",
    MutantStatus.TIMEOUT: "timeout",
    MutantStatus.NO_TESTS: "no tests",
    MutantStatus.ERROR: "error",
    MutantStatus.EQUIVALENT: "equivalent",
}

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;color:#222;
  padding:0 1.5em 3em}
h1{font-size:1.6em;margin:.8em 0 .2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
.meta{color:#555;margin:.2em 0}.meta code{font-size:.95em}
table{border-collapse:collapse;margin:.5em 0}
th,td{padding:.25em .6em;text-align:left;vertical-align:top}
thead th{border-bottom:2px solid #bbb}tbody tr{border-bottom:1px solid #eee}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
#score{font-size:3em;font-weight:700;margin:.1em 0}
.status{font-weight:600;padding:0 .35em;border-radius:3px;color:#fff;white-space:nowrap}
.s-killed{background:#2e7d32}.s-survived{background:#c62828}.s-timeout{background:#ef6c00}
.s-no_tests{background:#9e9e9e}.s-error{background:#6a1b9a}.s-stale{background:#455a64}.s-carried{background:#b71c1c}.s-not_yet{background:#78909c}.s-equivalent{background:#1565c0}
.flag{color:#b71c1c;font-weight:600}
pre{margin:.3em 0;padding:.5em;background:#f6f8fa;overflow-x:auto;font-size:12.5px}
code,pre,.src{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
table.source{width:100%;font-size:12.5px}table.source td{padding:0 .5em}
table.source tr{border:0}.src{white-space:pre}
td.ln{color:#888;text-align:right;user-select:none;width:3.5em}
td.cov{width:.4em;padding:0}td.tests{color:#888;text-align:right;width:3em}
tr.covered td.cov{background:#66bb6a}tr.partly td.cov{background:#ffca28}
tr.missed td.cov{background:#ef5350}tr.missed td.src{background:#fdecea}
tr.partly td.src{background:#fff8e1}tr.outside{opacity:.45}
tr.mutants td{padding:.2em .5em .4em 4.5em}
details.line-tests{margin:.15em 0;color:#555}
details.mutant{margin:.15em 0;border-left:4px solid #ccc;padding-left:.5em}
details.mutant.killed{border-color:#2e7d32}details.mutant.survived{border-color:#c62828}
details.mutant.timeout{border-color:#ef6c00}details.mutant.error{border-color:#6a1b9a}
details.mutant>summary{cursor:pointer}details.mutant dl{margin:.3em 0}
dt{font-weight:600;margin-top:.3em}dd{margin-left:1em}
.legend span{margin-right:1em}td code{word-break:break-all}
.legend i{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:-.1em}
"""


def escape(text: str, quote: bool = True) -> str:
    """:func:`html.escape`, and what would not show as itself made visible
    (:func:`audit.core.text.visible`): a test's ANSI colours, a bidirectional override."""
    return visible(html.escape(text, quote))


def render_index(results: AuditResults) -> str:
    """``index.html``: scores, coverage, the status picture, survivors first."""
    overall = results.overall
    survivors = results.survivors()
    parts = [
        _head(f"fence-audit: {percent_text(overall.score)} — vLLM {results.vllm_version}"),
        "<h1>fence-audit report</h1>",
        *_incomplete(results),
        *_shard(results),
        _meta(results),
        *_changed(results),
        '<section id="summary"><h2>Score</h2>',
        f'<p id="score">{percent_text(overall.score)}</p>',
        f"<p>{_denominator(overall)}. {results.out_of_region} mutants outside every region "
        "were not run.</p>",
        _status_picture(results.regions),
        "</section>",
        '<section id="regions"><h2>Regions</h2>',
        _region_table(results.regions, bool(results.random_workloads)),
        *_random_alone(results),
        "</section>",
        f'<section id="survivors"><h2>Survivors ({len(survivors)})</h2>',
        _mutant_table(survivors, empty="No mutant survived."),
        "</section>",
    ]
    if results.findings:
        items = "".join(
            f"<li><strong>{escape(f.id)}</strong>: {escape(f.title)} "
            f"(write-up: <code>{escape(f.doc)}</code> in fence-audit's repository; releases "
            f"{escape(', '.join(f.releases))})"
            "<br>failing on the unmutated code: "
            + ", ".join(
                f"<code>{escape(t)}</code>"
                + (" (left out of the mutant phase)" if t in f.left_out else "")
                for t in f.tests
            )
            + "</li>"
            for f in results.findings
        )
        parts += [
            f'<section id="findings"><h2>Real vLLM bugs in this release '
            f"({len(results.findings)})</h2><ul>{items}</ul>"
            "<p>Each open one as vLLM would take it, a test in its idiom and a minimal fix, "
            'checked on the release: <a href="upstream/index.html">the upstream series</a> '
            "(written by <code>nox -s upstream</code>).</p></section>"
        ]
    if results.catalogue:
        stale, carried = len(results.stale()), len(results.carried())
        parts += [
            f'<section id="catalogue"><h2>Catalogue entries ({len(results.catalogue)}'
            f"{f', {stale} stale' if stale else ''}"
            f"{f', {carried} carried by this release' if carried else ''})</h2>",
            "<p>Hand-written fence bugs (<code>mutants/catalogue/</code>): the suite expected "
            "to kill each, and what did.</p>",
            _catalogue_table(results),
            "</section>",
        ]
    if results.equivalents:
        parts += [
            f'<section id="equivalents"><h2>Equivalent mutants ({len(results.equivalents)})'
            "</h2><p>Reviewed in <code>mutants/equivalents.toml</code>: survivors no test can "
            "kill, outside the score. A verdict expires when its function changes.</p>",
            _equivalents_table(results),
            "</section>",
        ]
    others = [m for m in results.mutants if m.status is not MutantStatus.SURVIVED]
    parts += [
        f'<section id="mutants"><h2>Other mutants ({len(others)})</h2>',
        _mutant_table(_by_status(others), empty="None."),
        "</section>",
        _footer(results),
    ]
    return "\n".join(parts)


def _incomplete(results: AuditResults) -> list[str]:
    """The banner of an interrupted run's results (none for a complete run)."""
    if not results.interrupted:
        return []
    return [
        f'<p id="incomplete" class="flag">Incomplete: {results.interrupted}; run '
        "<code>fence-audit mutate</code> again to resume.</p>"
    ]


def _shard(results: AuditResults) -> list[str]:
    """The banner of one shard's results (``mutate --shard K/N``; none for a run)."""
    if results.shard is None:
        return []
    return [
        f'<p id="shard" class="flag">One shard: {escape(results.shard.described())}; the '
        "scores are of its mutants alone. <code>fence-audit merge</code> every shard for "
        "the run's.</p>"
    ]


def _changed(results: AuditResults) -> list[str]:
    """A pull-request run's head: what changed since the ref, and that code's score."""
    since = results.since
    if since is None:
        return []
    compared = f"<code>{escape(since.path)}</code>"
    if since.renamed:
        compared += f" (renamed from <code>{escape(since.old_path)}</code>)"
    elif not since.old_path:
        compared += " (new since then)"
    compared += (
        f" since <code>{escape(since.ref)}</code> (<code>{escape(since.commit[:12])}</code>)"
    )
    parts = ['<section id="changed"><h2>Changed code</h2>']
    if not since.lines:
        parts.append(
            f"<p>Nothing changed in {compared}: no mutant was judged, and the gate was not "
            "checked.</p>"
        )
        return [*parts, "</section>"]
    tally = since.tally
    group = f'<a href="{escape(region_file(since.group))}"><code>{escape(since.group)}</code></a>'
    parts += [
        f'<p id="changed-score" style="font-size:2em;font-weight:700">{tally.killed} of '
        f"{tally.judged} mutants in the changed code killed ({percent_text(tally.score)})</p>",
        f"<p>{compared}: {escape(since.lines_text(30))}.</p>",
        f"<p>{len(results.mutants)} mutant{'' if len(results.mutants) == 1 else 's'} on "
        f"changed lines: {_denominator(tally)}. "
        f"{len(results.mutants_of(since.group))} of them lie outside every region, in "
        f"{group}, scored apart: the score below leaves them out. Every survivor below is "
        'in the changed code (<a href="#survivors">survivors</a>).</p>',
        "</section>",
    ]
    return parts


def render_region(results: AuditResults, region: RegionResult) -> str:
    """``regions/NAME.html``: the region's functions, line by line, mutants inline."""
    mutants = results.mutants_of(region.name)
    by_line: dict[int, list[MutantRecord]] = {}
    for mutant in mutants:
        by_line.setdefault(mutant.line, []).append(mutant)
    functions = [f for f in results.functions if region.name in f.regions]
    parts = [
        _head(f"fence-audit: region {region.name} — vLLM {results.vllm_version}"),
        '<p><a href="../index.html">← all regions</a></p>',
        f"<h1>Region {escape(region.name)}</h1>",
        f'<p class="meta">{escape(region.description)}</p>',
        *(
            f'<p class="meta">Absent in vLLM {escape(results.vllm_version)} (not yet in this '
            f"release): {escape(part)}</p>"
            for part in region.absent
        ),
        f'<p class="meta">Score <strong>{percent_text(region.tally.score)}</strong>: '
        f"{_denominator(region.tally)}. Lines {fraction_text(region.lines)}, branches "
        f"{fraction_text(region.branches)} covered by the baseline.</p>",
        '<p class="legend"><span><i style="background:#66bb6a"></i>covered</span>'
        '<span><i style="background:#ffca28"></i>partly (a branch never taken)</span>'
        '<span><i style="background:#ef5350"></i>missed</span>'
        "<span>dimmed: outside this region</span><span>right column: covering tests</span></p>",
    ]
    if region.name in APART:  # outside the fence: read function by function
        parts.append(_function_table(results.by_function(region.name)))
    for function in functions:
        parts.append(_source_table(function, region.name, by_line))
    placed = {line for f in functions for line in range(f.start, f.end + 1)}
    for module in sorted({m.module for m in mutants if m.module}):
        parts.append(f"<h2>In <code>{escape(module)}</code></h2>")
        parts.append(
            "<p>Catalogue entries of another module: no per-line coverage is measured "
            "there, so every test of the suite judged them.</p>"
        )
        parts.extend(_mutant_details(m, None) for m in mutants if m.module == module)
    stray = [m for m in mutants if not m.module and m.line not in placed]
    if stray:  # not expected: every mutant lies in a region function; never hide one
        parts.append("<h2>Mutants outside the functions shown</h2>")
        parts.extend(_mutant_details(m, None) for m in stray)
    parts.append(_footer(results))
    return "\n".join(parts)


def region_file(name: str) -> str:
    return f"regions/{name}.html"


# --- pieces ----------------------------------------------------------------------


def _head(title: str) -> str:
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>"
    )


def _footer(results: AuditResults) -> str:
    return (
        f'<footer><p class="meta">Results written by fence-audit '
        f"{escape(results.tool_version)}; report rendered by fence-audit {escape(__version__)}."
        "</p></footer>\n</body>\n</html>\n"
    )


def _meta(results: AuditResults) -> str:
    suites = ", ".join(f"<code>{escape(p)}</code>" for p in results.suite_paths) or "none"
    return (
        f'<p class="meta">vLLM <strong>{escape(results.vllm_version)}</strong>, target '
        f"<code>{escape(results.target_module)}</code> (sha256 "
        f"<code>{escape(results.target_sha256[:16])}…</code>)</p>\n"
        f'<p class="meta">Suites: {suites}; tests from {escape(results.suite_origin)}</p>\n'
        f'<p class="meta">Run {escape(results.started_at)}, mutant phase '
        f"{results.duration_s:.1f} s ({_cached(results)}), engine {escape(results.engine)}, "
        f"fence-audit {escape(results.tool_version)}</p>"
    )


def _cached(results: AuditResults) -> str:
    cached = sum(m.cached for m in results.mutants)
    return f"{len(results.mutants) - cached} mutants judged in this run, {cached} from the cache"


def _denominator(tally: Tally) -> str:
    return (
        f"{tally.killed} killed of {tally.judged} judged (killed + survived + timeout: "
        f"{tally.killed} + {tally.survived} + {tally.timeout}); counted apart: "
        f"{tally.no_tests} with no covering test, {tally.error} errors"
    )


def _absent_note(region: RegionResult) -> str:
    if not region.absent:
        return ""
    count = len(region.absent)
    return f" <em>({count} part{'s' if count != 1 else ''} absent in this release)</em>"


def _random_alone(results: AuditResults) -> list[str]:
    """``mutate --random-alone``: what the random workloads kill with no targeted test."""
    if not results.random_workloads:
        return []
    entries = [m for m in results.mutants if m.random is not None and m.origin == "catalogue"]
    missed = [m for m in entries if not m.killed_by_random]
    workloads = ", ".join(f"<code>{escape(w)}</code>" for w in results.random_workloads)
    text = (
        f'<p id="random-alone">Random workloads alone ({workloads}): every fence mutant '
        f"judged again with only them, no targeted test. They kill "
        f"{results.killed_by_random} of {results.overall.judged} judged mutants "
        f"({percent_text(results.random_score)}) and {len(entries) - len(missed)} of "
        f"{len(entries)} catalogue entries.</p>"
    )
    if missed:
        text += (
            "<p>Catalogue entries they do not kill: "
            + ", ".join(
                f'<a href="{escape(region_file(m.region))}#{escape(m.anchor)}">'
                f"<code>{escape(m.operator)}</code></a>"
                for m in missed
            )
            + ".</p>"
        )
    return [text]


def _region_table(regions: Iterable[RegionResult], random: bool = False) -> str:
    """``random``: the run measured the random workloads alone (their column)."""
    rows = []
    for region in regions:
        t = region.tally
        rows.append(
            "<tr>"
            f'<td><a href="{escape(region_file(region.name))}">{escape(region.name)}</a></td>'
            f'<td class="num"><strong>{percent_text(t.score)}</strong></td>'
            f'<td class="num">{percent_text(region.vllm_score)}</td>'
            + (
                f'<td class="num">{percent_text(region.random_score)} '
                f"({region.killed_by_random})</td>"
                if random and region.killed_by_random is not None
                else ("<td class=num>n/a</td>" if random else "")
            )
            + f'<td class="num">{t.killed}</td><td class="num">{t.survived}</td>'
            f'<td class="num">{t.timeout}</td><td class="num">{t.judged}</td>'
            f'<td class="num">{t.no_tests}</td><td class="num">{t.error}</td>'
            f'<td class="num">{fraction_text(region.lines)}</td>'
            f'<td class="num">{fraction_text(region.branches)}</td>'
            f"<td>{escape(region.description)}{_absent_note(region)}</td></tr>"
        )
    return (
        "<table><thead><tr><th>region</th><th class=num>score</th>"
        '<th class=num title="killed by a test of vLLM\'s own suite">vLLM alone</th>'
        + (
            '<th class=num title="killed when judged again by the random workloads alone">'
            "random workloads alone</th>"
            if random
            else ""
        )
        + "<th class=num>killed</th>"
        "<th class=num>survived</th><th class=num>timeout</th><th class=num>judged</th>"
        "<th class=num>no tests</th><th class=num>errors</th><th class=num>lines</th>"
        "<th class=num>branches</th><th>what it is</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _function_table(functions: Iterable[FunctionTally]) -> str:
    rows = [
        f"<tr><td><code>{escape(f.name)}</code></td>"
        f'<td class="num"><strong>{percent_text(f.tally.score)}</strong></td>'
        f'<td class="num">{percent_text(f.vllm_score)}</td>'
        f'<td class="num">{f.tally.killed}</td><td class="num">{f.tally.survived}</td>'
        f'<td class="num">{f.tally.timeout}</td><td class="num">{f.tally.judged}</td>'
        f'<td class="num">{f.tally.no_tests}</td></tr>'
        for f in functions
    ]
    return (
        "<h2>By function</h2><table><thead><tr><th>function</th><th class=num>score</th>"
        '<th class=num title="killed by a test of vLLM\'s own suite">vLLM alone</th>'
        "<th class=num>killed</th><th class=num>survived</th><th class=num>timeout</th>"
        "<th class=num>judged</th><th class=num>no tests</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _status_picture(regions: tuple[RegionResult, ...]) -> str:
    """One stacked bar per region: its mutants by status, as inline SVG."""
    label_w, bar_w, row_h = 130, 520, 26
    height = row_h * len(regions) + 30
    out = [
        f'<figure id="picture"><svg role="img" aria-label="mutants by status per region" '
        f'xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 90}" height="{height}">'
    ]
    for row, region in enumerate(regions):
        y = row * row_h + 4
        counts = {s: getattr(region.tally, s.value) for s in STATUS_ORDER}
        total = sum(counts.values())
        out.append(f'<text x="0" y="{y + 15}" font-size="13">{escape(region.name)}</text>')
        x = float(label_w)
        for status in reversed(STATUS_ORDER):  # killed first, from the left
            count = counts[status]
            if not count:
                continue
            width = bar_w * count / total
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{row_h - 8}" '
                f'fill="{STATUS_COLOURS[status]}"><title>{escape(region.name)}: {count} '
                f"{STATUS_LABELS[status]}</title></rect>"
            )
            x += width
        out.append(
            f'<text x="{label_w + bar_w + 8}" y="{y + 15}" font-size="12">{total} mutants</text>'
        )
    legend_y = row_h * len(regions) + 20
    x = label_w
    for status in reversed(STATUS_ORDER):
        out.append(
            f'<rect x="{x}" y="{legend_y - 10}" width="10" height="10" '
            f'fill="{STATUS_COLOURS[status]}"/><text x="{x + 14}" y="{legend_y}" '
            f'font-size="12">{STATUS_LABELS[status]}</text>'
        )
        x += 90
    out.append("</svg></figure>")
    return "".join(out)


def _by_status(mutants: Iterable[MutantRecord]) -> list[MutantRecord]:
    order = {status: i for i, status in enumerate(STATUS_ORDER)}
    return sorted(mutants, key=lambda m: (order[m.status], m.region, m.line, m.id))


def _status(status: MutantStatus) -> str:
    return f'<span class="status s-{status.value}">{STATUS_LABELS[status]}</span>'


def _link(mutant: MutantRecord) -> str:
    href = f"{region_file(mutant.region)}#{mutant.anchor}"
    return f'<a href="{escape(href)}"><code>{escape(mutant.id)}</code></a>'


def _mutant_table(mutants: Iterable[MutantRecord], *, empty: str) -> str:
    rows = [
        f"<tr><td>{_status(m.status)}</td><td>{_link(m)}</td><td>{escape(m.region)}</td>"
        f'<td class="num">{m.line}</td><td>{escape(m.label)}</td>'
        f"<td><code>{escape(_short(m.killed_by))}</code></td></tr>"
        for m in mutants
    ]
    if not rows:
        return f"<p>{escape(empty)}</p>"
    return (
        "<table><thead><tr><th>status</th><th>mutant</th><th>region</th><th class=num>line</th>"
        "<th>operator or title</th><th>killed by</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _catalogue_table(results: AuditResults) -> str:
    by_id = {m.id: m for m in results.mutants}
    rows = []
    for entry in results.catalogue:
        m = by_id.get(entry.id)
        if entry.state in ("carried", "not yet"):
            label = "this release carries this bug" if entry.state == "carried" else "not yet"
            rows.append(
                f'<tr><td><span class="status s-{entry.state.replace(" ", "_")}">'
                f"{escape(entry.state)}</span></td>"
                f"<td><code>{escape(entry.id)}</code></td><td>{escape(entry.title)}</td>"
                f"<td>{escape(entry.invariant)}</td><td>{escape(entry.expected)}</td><td></td>"
                f'<td><span class="flag">{label}: {escape(entry.reason)}</span></td></tr>'
            )
            continue
        if entry.stale or m is None:
            reason = escape(entry.reason or "not applied")
            rows.append(
                f'<tr><td><span class="status s-stale">stale</span></td>'
                f"<td><code>{escape(entry.id)}</code></td><td>{escape(entry.title)}</td>"
                f"<td>{escape(entry.invariant)}</td><td>{escape(entry.expected)}</td><td></td>"
                f'<td><span class="flag">STALE: {reason}</span></td></tr>'
            )
            continue
        verdict = escape(m.verdict)
        if m.verdict and m.verdict != "as expected":
            verdict = f'<span class="flag">{verdict}</span>'
        rows.append(
            f"<tr><td>{_status(m.status)}</td><td>{_link(m)}</td><td>{escape(m.title)}</td>"
            f"<td>{escape(m.invariant)}</td><td>{escape(m.expected)}</td>"
            f"<td><code>{escape(_short(m.killed_by))}</code></td><td>{verdict}</td></tr>"
        )
    return (
        "<table><thead><tr><th>status</th><th>entry</th><th>title</th><th>invariant</th>"
        "<th>expected killer</th><th>killed by</th><th>outcome</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _equivalents_table(results: AuditResults) -> str:
    rows = []
    for record in results.equivalents:
        state = escape(record.state)
        if record.state != "applied":
            state = f'<span class="flag">{state}</span>'
        rows.append(
            f"<tr><td>{state}</td><td><code>{escape(record.id)}</code></td>"
            f"<td>{escape(record.reason)}</td><td>{escape(record.reviewed)}</td></tr>"
        )
    return (
        "<table><thead><tr><th>state</th><th>mutant</th><th>why it is equivalent</th>"
        "<th>reviewed</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _source_table(
    function: SourceFunction, region: str, by_line: dict[int, list[MutantRecord]]
) -> str:
    rows = [f"<h2><code>{escape(function.name)}</code></h2>", '<table class="source"><tbody>']
    for line in function.lines:
        rows.append(_source_row(line, region))
        mutants = by_line.get(line.number, [])
        if mutants:
            # The line's tests are listed once, before its mutants, which point to them:
            # at --scope file a line's mutants share hundreds of tests.
            listed_at = line.number if line.tests else None
            listed = (
                ""
                if listed_at is None
                else _test_list(
                    line.tests,
                    f"{len(line.tests)} test{' covers' if len(line.tests) == 1 else 's cover'} "
                    f"line {listed_at}",
                    f' class="line-tests" id="{_tests_anchor(listed_at)}"',
                )
            )
            details = "".join(_mutant_details(m, listed_at) for m in mutants)
            rows.append(f'<tr class="mutants"><td colspan="4">{listed}{details}</td></tr>')
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _source_row(line: SourceLine, region: str) -> str:
    classes = [line.coverage or "none"]
    if line.region != region:
        classes.append("outside")
    tests = str(len(line.tests)) if line.tests else ""
    return (
        f'<tr class="{" ".join(classes)}" id="L{line.number}">'
        f'<td class="ln">{line.number}</td><td class="cov"></td>'
        f'<td class="src">{escape(line.text)}</td><td class="tests">{tests}</td></tr>'
    )


def _tests_anchor(line: int) -> str:
    return f"tests-L{line}"


def _mutant_details(mutant: MutantRecord, listed_at: int | None) -> str:
    """``mutant``, unfolded; ``listed_at``: the line whose covering tests the page lists
    above its mutants (None: list the mutant's own here)."""
    facts = [
        ("status", _status(mutant.status)),
        ("id", f"<code>{escape(mutant.id)}</code>"),
        ("origin", escape(mutant.origin)),
    ]
    if mutant.origin == "catalogue":
        facts += [
            ("title", escape(mutant.title)),
            ("invariant", escape(mutant.invariant)),
            ("the bug", escape(mutant.bug)),
            ("symptom", escape(mutant.symptom)),
            ("expected killer", escape(mutant.expected)),
            ("outcome against expectation", escape(mutant.verdict)),
        ]
        if mutant.history:
            facts.append(("history", escape(mutant.history)))
    else:
        facts.append(("operator", escape(mutant.operator)))
    if mutant.equivalence:
        facts.append(("equivalent, because", escape(mutant.equivalence)))
    if mutant.killed_by:
        facts.append(("killed by", f"<code>{escape(mutant.killed_by)}</code>"))
    if mutant.hung and mutant.killed_by:  # a timeout's failure already names them
        hung = "".join(f"<li><code>{escape(test)}</code></li>" for test in mutant.hung)
        facts.append(("tests stopped as hung", f"<ul>{hung}</ul>"))
    if mutant.random is not None:
        facts.append(("random workloads alone", _second(mutant.random)))
    if mutant.deep is not None:
        facts.append(("deep second look", _deep(mutant)))
    if mutant.failure:
        facts.append(("failure (first lines)", f"<pre>{escape(mutant.failure)}</pre>"))
    facts.append(
        (
            "tests run",
            f"{mutant.tests_run} of {len(mutant.covered_by)} covering, {mutant.duration_s:.2f} s",
        )
    )
    facts.append(("diff", f"<pre>{escape(mutant.diff)}</pre>"))
    facts.append(
        (
            "tests that cover the line",
            _test_list(mutant.covered_by)
            if listed_at is None
            else f'<a href="#{_tests_anchor(listed_at)}">listed above line {listed_at}\'s '
            "mutants</a>",
        )
    )
    body = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    return (
        f'<details class="mutant {mutant.status.value}" id="{escape(mutant.anchor)}">'
        f"<summary>{_status(mutant.status)} <code>{escape(mutant.label)}</code> "
        f"{escape(mutant.id)}</summary><dl>{body}</dl></details>"
    )


def _deep(mutant: MutantRecord) -> str:
    """A survivor's deep second look; a kill with its example as a regression test."""
    look = mutant.deep
    assert look is not None
    if look.status is not MutantStatus.KILLED:
        return escape(deep.OUTCOMES.get(look.status, look.status.value)) + (
            f" ({look.duration_s:.0f} s)"
        )
    test = deep.regression_test(look.failure, mutant.id, look.killed_by)
    return (
        f"<strong>killed by the deep hunt</strong> (<code>{escape(look.killed_by)}</code>, "
        f"{look.duration_s:.0f} s)"
        + (
            f"; its shrunk example, as a regression test to paste:<pre>{escape(test)}</pre>"
            if test
            else f"<pre>{escape(look.failure)}</pre>"
        )
    )


def _second(judgement: SecondJudgement) -> str:
    """A second judgement: its status, and the failure that killed the mutant."""
    text = _status(judgement.status) + f" ({judgement.duration_s:.2f} s)"
    if judgement.failure:
        text += f"<pre>{escape(judgement.failure)}</pre>"
    return text


def _test_list(tests: Iterable[str], summary: str = "", attributes: str = "") -> str:
    """Test ids grouped by test function, parametrisations counted, folded under
    ``summary`` (by default, how many)."""
    tests = tuple(tests)
    if not tests:
        return "none"
    groups = Counter(t.split("[", 1)[0] for t in tests)
    items = "".join(
        f"<li><code>{escape(name)}</code>{f' &times;{count}' if count > 1 else ''}</li>"
        for name, count in sorted(groups.items())
    )
    summary = summary or f"{len(tests)} tests"
    return f"<details{attributes}><summary>{summary}</summary><ul>{items}</ul></details>"


def _short(test_id: str) -> str:
    """A test id without its file path (the table has no room for it)."""
    return test_id.split("::", 1)[1] if "::" in test_id else test_id
