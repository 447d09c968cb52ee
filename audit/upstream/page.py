"""The upstream page: ``reports/upstream/index.html`` (and ``upstream.md``), rendered
from ``upstream.json``, which :func:`document` writes from the checks' outcome.

Per finding: its effect, the releases that have it, its test, its patch and what the
patch touches, and each check's result; then the series' checks; then the scores of
vLLM's suite alone and with the gap tests, side by side, per region.
"""

from __future__ import annotations

from html import escape
from typing import Any

from audit.core.text import visible
from audit.rendering.html_report import CSS
from audit.setup.findings import Finding
from audit.upstream.checks import REGIONS, Outcome, Score
from audit.upstream.series import Series

FORMAT = 1  # upstream.json: 1, first version (2026-12-07)


def document(outcome: Outcome, series: Series, findings: dict[str, Finding]) -> dict[str, Any]:
    """What ``upstream.json`` holds: everything the page shows, recomputed by the run."""
    return {
        "format": FORMAT,
        "release": outcome.release,
        "ok": outcome.ok,
        "fixes": [
            {
                "finding": fix.finding,
                "title": findings[fix.finding].title if fix.finding in findings else "",
                "effect": findings[fix.finding].effect if fix.finding in findings else "",
                "releases": list(findings[fix.finding].releases) if fix.finding in findings else [],
                "write_up": f"docs/upstream/{fix.finding}.md",
                "test": f"docs/upstream/tests/{fix.test}",
                "patch": f"docs/upstream/{fix.patch.relative_to(series.root).as_posix()}",
                "touches": list(fix.touches),
                "failure": outcome.failures.get(fix.finding, ""),
            }
            for fix in series.fixes
        ],
        "gap_tests": [f"docs/upstream/tests/{name}" for name in series.gap_tests],
        "checks": [
            {"step": c.step, "ok": c.ok, "detail": c.detail, "finding": c.finding, "log": c.log}
            for c in outcome.checks
        ],
        "folder": {
            "wall_s": round(outcome.folder_wall_s, 1),
            "files": {
                name: {"tests": tests, "seconds": round(seconds, 1)}
                for name, (tests, seconds) in outcome.folder_times.items()
            },
        },
        "scores": {
            name: _score_json(score)
            for name, score in (
                ("release", outcome.release_score),
                ("gaps", outcome.gap_score),
                ("patched", outcome.patched_score),
            )
            if score is not None
        },
    }


def _score_json(score: Score) -> dict[str, Any]:
    return {
        "killed": score.killed,
        "judged": score.judged,
        "killed_by_vllm": score.vllm_killed,
        "regions": {
            name: {"killed": k, "judged": j, "killed_by_vllm": score.vllm_regions.get(name, 0)}
            for name, (k, j) in score.regions.items()
        },
    }


def _pct(killed: int, judged: int) -> str:
    return f"{100.0 * killed / judged:.1f}% ({killed} of {judged})" if judged else "n/a"


def score_rows(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(region, vLLM alone, vLLM + gap tests) per region and overall, from the document."""
    scores = data.get("scores", {})
    release, gaps = scores.get("release"), scores.get("gaps")
    return [(name, _cell(release, name), _cell(gaps, name)) for name in (*REGIONS, "all")]


def _cell(score: dict[str, Any] | None, region: str) -> str:
    """What vLLM's tests killed of ``region`` ("all": every region) in ``score``."""
    if score is None:
        return "not measured"
    part = score if region == "all" else score["regions"].get(region)
    if part is None:
        return "n/a"
    return _pct(part["killed_by_vllm"], part["judged"])


def html_page(data: dict[str, Any]) -> str:
    checks = data["checks"]
    mark = {True: '<span class="ok">ok</span>', False: '<span class="bad">FAILED</span>'}
    steps = list(dict.fromkeys(c["step"] for c in checks if c["finding"]))
    head = "".join(f"<th>{escape(s)}</th>" for s in steps)
    rows = []
    for fix in data["fixes"]:
        own = {c["step"]: c for c in checks if c["finding"] == fix["finding"]}
        cells = "".join(
            f'<td title="{escape(visible(own[s]["detail"]))}">{mark[own[s]["ok"]]}'
            f'<br><small>{escape(visible(own[s]["detail"]))[:160]}</small></td>'
            if s in own else "<td>not run</td>"
            for s in steps
        )  # fmt: skip
        rows.append(
            f"<tr><td><b>{escape(fix['finding'])}</b><br><small>{escape(fix['title'])}</small>"
            f'<br><a href="../../{escape(fix["write_up"])}">issue and PR text</a></td>'
            f"<td>{escape(fix['effect'] or 'unknown')}</td>"
            f"<td>{escape(', '.join(fix['releases']))}</td>"
            f"<td><code>{escape(fix['test'])}</code></td>"
            f'<td><a href="../../{escape(fix["patch"])}"><code>{escape(fix["patch"])}</code></a>'
            f"<br><small>{escape('; '.join(fix['touches']))}</small></td>{cells}</tr>"
        )
    series_rows = "".join(
        f"<tr><td>{escape(c['step'])}</td><td>{mark[c['ok']]}</td>"
        f"<td>{escape(visible(c['detail']))}</td><td>{escape(c['log'])}</td></tr>"
        for c in checks
        if not c["finding"]
    )
    scores = "".join(
        f"<tr><td>{escape(n)}</td><td class=num>{escape(a)}</td><td class=num>{escape(b)}</td></tr>"
        for n, a, b in score_rows(data)
    )
    folder = data.get("folder", {})
    times = "".join(
        f"<tr><td><code>{escape(name)}</code></td><td class=num>{f['tests']}</td>"
        f"<td class=num>{f['seconds']:.1f}</td></tr>"
        for name, f in folder.get("files", {}).items()
    )
    verdict = "every check passed" if data["ok"] else "a check FAILED"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>fence-audit: the upstream series on vLLM {escape(data['release'])}</title>"
        f"<style>{CSS} .ok{{color:#2e7d32}} .bad{{color:#c62828;font-weight:bold}}</style>"
        "</head><body>"
        f"<h1>The upstream series on vLLM {escape(data['release'])}: {verdict}</h1>"
        "<p>Per open finding: a regression test in vLLM's idiom (it drops into "
        "<code>tests/v1/kv_connector/unit/offloading_connector/</code>) and a minimal fix, "
        'checked by <code>nox -s upstream</code>. <a href="../index.html">The audit\'s '
        "report</a>.</p>"
        f"<h2>Findings</h2><table><tr><th>finding</th><th>effect</th><th>releases</th>"
        f"<th>test</th><th>patch</th>{head}</tr>{''.join(rows)}</table>"
        "<h2>The series</h2><table><tr><th>check</th><th>result</th><th>measured</th>"
        f"<th>log</th></tr>{series_rows}</table>"
        "<h2>vLLM's suite alone, and with the gap tests</h2>"
        "<p>In-region mutants killed by vLLM's own fence tests (test_scheduler.py, "
        "test_worker.py), then by those plus the gap tests "
        f"({escape(', '.join(data['gap_tests']) or 'none')}); no test of this project.</p>"
        "<table><tr><th>region</th><th>vLLM alone</th><th>vLLM + these tests</th></tr>"
        f"{scores}</table>"
        "<h2>What a CPU job would run</h2><p>vLLM's offloading connector tests with the "
        f"gap tests, on this machine: {folder.get('wall_s', 0):.0f} s wall in all (the "
        "import included); per file, pytest's own time.</p>"
        f"<table><tr><th>file</th><th>tests</th><th>seconds</th></tr>{times}</table>"
        "</body></html>\n"
    )


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# The upstream series on vLLM {data['release']}: "
        + ("every check passed" if data["ok"] else "a check FAILED"),
        "",
        "| finding | effect | check | result | measured |",
        "|---|---|---|---|---|",
    ]
    effects = {f["finding"]: f["effect"] for f in data["fixes"]}
    for c in data["checks"]:
        detail = visible(c["detail"]).replace("|", "\\|")[:200]
        lines.append(
            f"| {c['finding'] or '(series)'} | {effects.get(c['finding'], '')} | {c['step']} "
            f"| {'ok' if c['ok'] else 'FAILED'} | {detail} |"
        )
    lines += ["", "| region | vLLM alone | vLLM + these tests |", "|---|---|---|"]
    lines += [f"| {n} | {a} | {b} |" for n, a, b in score_rows(data)]
    return "\n".join(lines) + "\n"
