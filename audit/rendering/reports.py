"""The reports stage: every report rendered from the results view, then written.

:data:`RENDERERS` is the one list of what the stage writes. Each renderer is a
function of :class:`AuditResults` (``audit.json`` read back), so ``fence-audit
report`` re-renders every file without running anything.

Everything is rendered in memory first, so a bad results file (or a bug in a
renderer) leaves the previous reports as they were: each file is replaced
atomically, the region pages as one folder. Only what fence-audit wrote is replaced
or removed (:mod:`audit.core.outputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from audit.core.files import write_text
from audit.core.outputs import claim, remove, replaced_folder
from audit.rendering.html_report import region_file, render_index, render_region
from audit.rendering.junit_report import render_junit
from audit.rendering.markdown_report import render_summary
from audit.rendering.stryker import SourceNotHere, render_mutation_report
from audit.results.view import AuditResults

# Files by their path under the reports folder, from this run (and an older one, for
# the changes shown in summary.md).
Renderer = Callable[[AuditResults, AuditResults | None], Mapping[str, str]]
REGIONS_DIR = "regions"  # replaced as one folder: a region gone from the run loses its page


@dataclass(frozen=True, slots=True)
class Written:
    index: Path
    summary: Path
    junit: Path
    mutation: Path
    regions: tuple[Path, ...]
    skipped: dict[str, str]  # a report not rendered here, with the reason


# The renderers look their functions up when called, not when this list is built, so a
# test can replace one (test_reports.py: a failing renderer writes nothing).
RENDERERS: tuple[Renderer, ...] = (
    lambda results, _: {"index.html": render_index(results)},
    lambda results, _: {region_file(r.name): render_region(results, r) for r in results.regions},
    lambda results, previous: {"summary.md": render_summary(results, previous)},
    lambda results, _: {"junit.xml": render_junit(results)},
    lambda results, _: {"mutation.json": render_mutation_report(results)},
)


def render_reports(
    results: AuditResults, previous: AuditResults | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """Every report's text by its path under the reports folder, in the order written;
    and the reports that cannot be rendered on this machine, with the reason (Stryker's
    is rendered over the audited source, which ``audit.json`` does not hold)."""
    rendered: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for renderer in RENDERERS:
        try:
            rendered.update(renderer(results, previous))
        except SourceNotHere as reason:
            skipped["mutation.json"] = str(reason)
    return rendered, skipped


def write_reports(
    results: AuditResults, directory: Path, previous: AuditResults | None = None
) -> Written:
    rendered, skipped = render_reports(results, previous)
    pages = {name: text for name, text in rendered.items() if Path(name).parent.name == REGIONS_DIR}
    with replaced_folder(directory, REGIONS_DIR) as staging:
        for name, text in pages.items():
            write_text(staging / Path(name).name, text)
    files = {name: text for name, text in rendered.items() if name not in pages}
    claim(directory, *files)
    for name, text in files.items():
        write_text(directory / name, text)
    for name in skipped:  # an older run's report must not stand beside these results
        remove(directory, name)
    return Written(
        index=directory / "index.html",
        summary=directory / "summary.md",
        junit=directory / "junit.xml",
        mutation=directory / "mutation.json",
        regions=tuple(directory / name for name in pages),
        skipped=skipped,
    )
