"""``summary.md``: the score table and the survivors, for a PR comment or a CI step summary.

With an older results file (``--compare``) it also shows the change of score per
region and every mutant whose status changed, appeared or disappeared. The results of
a pull-request run (``--since``) lead with the changed code's score and survivors,
the comment a reviewer reads; the usual tables follow.
"""

from __future__ import annotations

import re

from audit.core.protocol import MutantStatus
from audit.core.text import visible, visible_lines
from audit.judging import alone, deep
from audit.mutation.scope import FILE, OUTSIDE_REGIONS
from audit.results.scores import Tally
from audit.results.view import AuditResults, ChangeRecord, MutantRecord
from audit.setup.model import percent_text

# GitHub folds a step summary above 1 MiB; long diffs are cut well below that.
DIFF_LINES = 40
# A pull-request run's survivors shown with their diff; the others by id only.
SURVIVORS_SHOWN = 20


def render_summary(results: AuditResults, previous: AuditResults | None = None) -> str:
    overall = results.overall
    lines = [
        f"## fence-audit: {percent_text(overall.score)} of fence mutants killed "
        f"(vLLM {_cell(results.vllm_version)})",
        "",
    ]
    if results.since is not None:  # a pull-request run: the changed code first
        if not results.since.lines:
            return "\n".join(_nothing_changed(results, results.since))
        lines = [
            *_changed_code(results, results.since),
            f"### Fence regions: {percent_text(overall.score)} of their changed mutants "
            f"killed (vLLM {_cell(results.vllm_version)})",
            "",
        ]
    if results.interrupted:
        lines += [
            f"> **Incomplete**: {results.interrupted}; run `fence-audit mutate` again to resume.",
            "",
        ]
    lines += _shard(results)
    lines += [
        f"{overall.killed} killed of {overall.judged} judged (killed + survived + timeout); "
        f"{overall.no_tests} with no covering test and {overall.error} errors counted apart. "
        f"Suites: {', '.join(_code(p) for p in results.suite_paths) or 'none'}.",
        "",
        _score_table(results, previous),
        "",
    ]
    if results.since is not None:
        lines += [
            f"{_code(results.since.group)}: the changed code outside every region (or across a "
            "region's edge), scored apart: not in **all**; the gate checks it only when a "
            "threshold names it.",
            "",
        ]
    lines += _by_function(results) if results.scope == FILE else []
    lines += _random_alone(results) if results.random_workloads else []
    absent = [(r.name, part) for r in results.regions for part in r.absent]
    if absent:
        lines += [f"Absent in vLLM {_cell(results.vllm_version)} (not yet in this release):", ""]
        lines += [f"- {_cell(name)}: {_cell(part)}" for name, part in absent]
        lines.append("")
    if previous is not None:
        lines += _changes(results, previous)
    survivors = _fence_survivors(results, lines)
    if results.since is None:  # a pull-request run listed them first
        lines += [f"### Survivors ({len(survivors)})", "", *_deep_summary(results)]
        if not survivors:
            lines += ["No mutant survived.", ""]
        for mutant in survivors:
            lines += _survivor(mutant, results.vllm_version)
    if results.equivalents:
        lines += [f"### Equivalent mutants ({len(results.equivalents)})", ""]
        lines += [
            f"- {_code(e.id)}: {_cell(e.state)}. {_cell(e.reason)}"
            + ("" if e.state == "applied" else " **(flagged: the verdict no longer holds)**")
            for e in results.equivalents
        ]
        lines.append("")
    if results.findings:
        lines += [f"### Real vLLM bugs in this release ({len(results.findings)})", ""]
        lines += [
            f"- **{_cell(f.id)}**: {_cell(f.title)} "
            f"(write-up: {_code(f.doc)} in fence-audit's repository); "
            + _finding_tests(len(f.tests), len(f.left_out))
            for f in results.findings
        ]
        lines.append("")
    carried = results.carried()
    if carried:
        lines += [f"### This release carries these catalogue bugs ({len(carried)})", ""]
        lines += [
            f"- {_code(c.id)} {_cell(c.title)}: this release carries this bug ({_cell(c.reason)})"
            for c in carried
        ]
        lines.append("")
    stale = results.stale()
    if stale:
        lines += [f"### Stale catalogue entries ({len(stale)})", ""]
        lines += [f"- {_code(c.id)} ({_cell(c.file)}): {_cell(c.reason)}" for c in stale]
        lines.append("")
    flagged = [m for m in results.mutants if m.verdict and m.verdict != "as expected"]
    if flagged:
        lines += [f"### Catalogue entries against expectation ({len(flagged)})", ""]
        lines += [
            f"- {_code(m.id)} {_cell(m.title)}: expected {_cell(m.expected)}, {m.status.value}"
            f"{f' by {_code(m.killed_by)}' if m.killed_by else ''} ({_cell(m.verdict)})"
            for m in flagged
        ]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _fence_survivors(results: AuditResults, lines: list[str]) -> tuple[MutantRecord, ...]:
    """The survivors to list; with --scope file the fence's, and the others counted
    into ``lines`` (their functions' table lists them)."""
    survivors = results.survivors()
    if results.scope != FILE:
        return survivors
    apart = [m for m in survivors if m.region == OUTSIDE_REGIONS]
    lines += [f"{len(apart)} survivors outside the regions: see the table above.", ""]
    return tuple(m for m in survivors if m.region != OUTSIDE_REGIONS)


def _by_function(results: AuditResults) -> list[str]:
    """--scope file: the module outside the regions, function by function."""
    functions = results.by_function(OUTSIDE_REGIONS)
    lines = [
        f"{_code(OUTSIDE_REGIONS)}: every function of the module outside the fence regions, "
        "scored apart: not in **all**; the gate checks it only when a threshold names it.",
        "",
        f"### Outside the regions, by function ({len(functions)})",
        "",
        "| function | score | vLLM alone | killed | survived | timeout | judged | no tests |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    lines += [
        f"| {_code(f.name)} | {percent_text(f.tally.score)} | {percent_text(f.vllm_score)} "
        f"| {f.tally.killed} | {f.tally.survived} | {f.tally.timeout} | {f.tally.judged} "
        f"| {f.tally.no_tests} |"
        for f in functions
    ]
    return [*lines, ""]


def _shard(results: AuditResults) -> list[str]:
    """The banner of one shard's results (``mutate --shard K/N``; none for a run)."""
    if results.shard is None:
        return []
    return [
        f"> **One shard**: {results.shard.described()}; the scores are of its mutants "
        "alone. `fence-audit merge` every shard for the run's.",
        "",
    ]


def _changed_code(results: AuditResults, since: ChangeRecord) -> list[str]:
    """The head of a pull-request run's summary: the changed code's score and survivors."""
    tally = since.tally
    if results.mutants:
        head = (
            f"## fence-audit: {tally.killed} of {tally.judged} mutants in the changed code "
            f"killed ({percent_text(tally.score)})"
        )
    else:
        head = "## fence-audit: no mutant in the changed code"
    lines = [head, ""]
    if results.interrupted:
        lines += [f"> **Incomplete**: {results.interrupted}.", ""]
    lines += _shard(results)
    outside = len(results.mutants_of(since.group))
    lines += [
        f"{_compared(since)}: {since.lines_text(12)}. vLLM {_cell(results.vllm_version)}.",
        "",
        f"{_mutants(len(results.mutants))} on changed lines: {tally.killed} killed "
        f"of {tally.judged} judged (killed + survived + timeout); {tally.no_tests} with no "
        f"covering test, {tally.error} errors and {tally.equivalent} equivalent counted "
        f"apart; {outside} of them outside every region ({_code(since.group)}).",
        "",
    ]
    if not results.mutants:
        lines += [
            "The changed lines hold nothing mutmut or the catalogue mutates (comments, "
            "imports, code outside functions).",
            "",
        ]
        return lines
    # The fence regions' survivors first; a PR comment holds 65,536 characters, so
    # past the first SURVIVORS_SHOWN only their ids (every diff is in audit.json).
    order = {region.name: n for n, region in enumerate(results.regions)}
    survivors = sorted(results.survivors(), key=lambda m: order.get(m.region, len(order)))
    lines += [f"### Survivors in the changed code ({len(survivors)})", ""]
    if not survivors:
        lines += ["No mutant survived.", ""]
    for mutant in survivors[:SURVIVORS_SHOWN]:
        lines += _survivor(mutant, results.vllm_version)
    rest = survivors[SURVIVORS_SHOWN:]
    if rest:
        lines += [f"And {len(rest)} more (their diffs are in `audit.json` and `index.html`):", ""]
        lines += [f"- {_code(m.id)}: {_cell(m.region)}, line {m.line}" for m in rest]
        lines.append("")
    return lines


def _mutants(count: int) -> str:
    return f"{count} mutant{'' if count == 1 else 's'}"


def _nothing_changed(results: AuditResults, since: ChangeRecord) -> list[str]:
    name = since.path.rsplit("/", 1)[-1]
    return [
        f"## fence-audit: nothing changed in {_code(name)} since {_code(since.ref)}",
        "",
        f"{_compared(since)}: no changed line, so no mutant was judged and the gate was "
        f"not checked. vLLM {_cell(results.vllm_version)}.",
        "",
    ]


def _compared(since: ChangeRecord) -> str:
    """What a pull-request run compared: ``path`` since ``ref`` (``sha``)."""
    path = _code(since.path)
    if since.renamed:
        path += f" (renamed from {_code(since.old_path)})"
    elif not since.old_path:
        path += " (new since then)"
    return f"{path} since {_code(since.ref)} (`{since.commit[:12]}`)"


def _code(text: str, *, table: bool = False) -> str:
    """A code span that holds ``text`` whatever backticks it has (a git ref may, a
    pytest id too), on one line; in a ``table`` row its pipes escaped (GitHub reads
    ``\\|`` inside a code span of a table as a pipe)."""
    text = visible(" ".join(text.splitlines()))
    longest = _longest_backticks(text)
    pad = " " if longest or text.startswith(" ") else ""
    span = f"{'`' * (longest + 1)}{pad}{text}{pad}{'`' * (longest + 1)}"
    return span.replace("|", "\\|") if table else span


def _fenced(text: str, language: str = "") -> list[str]:
    """``text`` as a fenced code block no line of it can close: the fence is longer
    than any run of backticks in it."""
    fence = _fence(text)
    return [fence + language, *visible_lines(text.rstrip("\n")), fence]


def _fence(text: str) -> str:
    """Backticks enough that no line of ``text`` closes the block."""
    return "`" * max(3, _longest_backticks(text) + 1)


def _longest_backticks(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)


def _finding_tests(count: int, left_out: int) -> str:
    """How a finding shows in this project's tests on the unmutated code."""
    tests = f"{count} test{'s' if count != 1 else ''} of this project"
    if not left_out:
        return f"{tests}, strict expected failures on this release"
    return f"{tests} fail on the unmutated code; {left_out} of them judged no mutant"


def _score_table(results: AuditResults, previous: AuditResults | None) -> str:
    measured = bool(results.random_workloads)  # --random-alone: its column
    header = (
        "| region | score | vLLM alone | "
        + ("random workloads alone | " if measured else "")
        + "killed | survived | timeout | no tests | errors | lines | branches |"
    )
    rule = "|---|--:|--:|" + ("--:|" if measured else "") + "--:|--:|--:|--:|--:|--:|--:|"
    if previous is not None:
        header += " change |"
        rule += "--:|"
    rows = [header, rule]
    old = {r.name: r.tally for r in previous.regions} if previous else {}
    for region in results.regions:
        name, tally, lines, branches = region.name, region.tally, region.lines, region.branches
        row = (
            f"| {_cell(name)} | {percent_text(tally.score)} | {percent_text(region.vllm_score)} "
            + (
                f"| {_random_cell(region.random_score, region.killed_by_random)} "
                if measured
                else ""
            )
            + f"| {tally.killed} "
            f"| {tally.survived} | {tally.timeout} "
            f"| {tally.no_tests} | {tally.error} | {lines.covered}/{lines.total} "
            f"| {branches.covered}/{branches.total} |"
        )
        if previous is not None:
            row += f" {_delta(old.get(name), tally)} |"
        rows.append(row)
    overall = results.overall
    row = (
        f"| **all** | **{percent_text(overall.score)}** | {percent_text(results.vllm_score)} "
        + (f"| {_random_cell(results.random_score, results.killed_by_random)} " * measured)
        + f"| {overall.killed} | {overall.survived} "
        f"| {overall.timeout} | {overall.no_tests} | {overall.error} | | |"
    )
    if previous is not None:
        row += f" {_delta(previous.overall, overall)} |"
    rows.append(row)
    return "\n".join(rows)


def _random_cell(score: float | None, killed: int | None) -> str:
    return f"{percent_text(score)} ({killed})" if killed is not None else "n/a"


def _random_alone(results: AuditResults) -> list[str]:
    """``--random-alone``: what the random workloads kill with no targeted test."""
    fence = [m for m in results.mutants if m.random is not None]
    entries = [m for m in fence if m.origin == "catalogue"]
    missed = [m for m in entries if not m.killed_by_random]
    own = [m for m in fence if m.origin == "mutmut" and m.status in alone.SCORED]
    lines = [
        f"### Random workloads alone ({', '.join(_code(w) for w in results.random_workloads)})",
        "",
        f"Each fence mutant judged again with only the random workloads: they kill "
        f"{sum(m.killed_by_random for m in own)} of {len(own)} judged mutmut mutants and "
        f"{len(entries) - len(missed)} of {len(entries)} catalogue entries without any "
        "targeted test.",
        "",
    ]
    if missed:
        lines += ["Catalogue entries they do not kill:", ""]
        lines += [
            f"- {_code(m.id)} {_cell(m.title)}: {m.random.status.value if m.random else ''}"
            for m in missed
        ]
        lines.append("")
    return lines


def _delta(old: Tally | None, new: Tally) -> str:
    if old is None:
        return "new"
    if old.score is None or new.score is None:
        return "n/a"
    change = new.score - old.score
    return "±0.0" if abs(change) < 0.05 else f"{change:+.1f}"


def _changes(results: AuditResults, previous: AuditResults) -> list[str]:
    old = {m.id: m for m in previous.mutants}
    new = {m.id: m for m in results.mutants}
    changed = [
        (
            mutant_id,
            old[mutant_id].status.value if mutant_id in old else "(absent)",
            new[mutant_id].status.value if mutant_id in new else "(absent)",
        )
        for mutant_id in sorted(old.keys() | new.keys())
        if mutant_id not in old
        or mutant_id not in new
        or old[mutant_id].status != new[mutant_id].status
    ]
    lines = [f"### Status changes since the previous run ({len(changed)})", ""]
    if not changed:
        return [*lines, "None.", ""]
    lines += ["| mutant | before | now |", "|---|---|---|"]
    lines += [
        f"| {_code(mutant_id, table=True)} | {before} | {now} |"
        for mutant_id, before, now in changed
    ]
    return [*lines, ""]


def _survivor(mutant: MutantRecord, vllm_version: str = "") -> list[str]:
    diff = visible_lines(mutant.diff.rstrip("\n"))
    if len(diff) > DIFF_LINES:
        diff = [*diff[:DIFF_LINES], f"... ({len(diff) - DIFF_LINES} more lines in audit.json)"]
    fence = _fence("\n".join(diff))
    label = f" {mutant.title}" if mutant.title else f" ({mutant.operator})"
    found = deep.found(mutant)
    return [
        "<details>",
        f"<summary><code>{_html(mutant.id)}</code>{_html(label)}: {_html(mutant.region)}, "
        f"line {mutant.line}, {len(mutant.covered_by)} covering tests"
        + (" <strong>(killed by the deep hunt)</strong>" if found else "")
        + "</summary>",
        "",
        f"{fence}diff",
        *diff,
        fence,
        *_deep_lines(mutant, vllm_version),
        "</details>",
        "",
    ]


def _deep_summary(results: AuditResults) -> list[str]:
    """``--deep``: how many survivors the deep second look killed."""
    if results.deep_look is None:
        return []
    profile, seconds = results.deep_look
    looked = [m for m in results.mutants if m.deep is not None]
    return [
        f"Deep second look (the random workloads alone, profile {_code(profile)}, up to "
        f"{seconds:g} s of CPU each): {sum(map(deep.found, looked))} of {len(looked)} "
        "survivors killed by the deep hunt. The score is the suite's: add the tests below "
        "to count them.",
        "",
    ]


def _deep_lines(mutant: MutantRecord, vllm_version: str) -> list[str]:
    """A survivor's deep second look: what it found, and the test to paste."""
    look = mutant.deep
    if look is None:
        return []
    if look.status is not MutantStatus.KILLED:
        return ["", f"Deep second look: {deep.OUTCOMES.get(look.status, look.status.value)}."]
    test = deep.regression_test(look.failure, mutant.id, look.killed_by, vllm_version)
    return [
        "",
        f"Deep second look: **killed by the deep hunt** ({_code(look.killed_by)}, "
        f"{look.duration_s:.0f} s). "
        + ("Its shrunk example, as a regression test to paste:" if test else "Its failure:"),
        "",
        *_fenced(test or look.failure, "python" if test else ""),
    ]


def _cell(text: str) -> str:
    """Run-derived text in a Markdown line: no table breaks, no HTML (GitHub renders it)."""
    return _html(text).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _html(text: str) -> str:
    return visible(text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
