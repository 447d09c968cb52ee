"""The reports stage: every report rendered from ``audit.json``, then written.

Everything is rendered in memory first, so a bad results file (or a bug in a
renderer) leaves the previous reports as they were: each file is replaced
atomically, the region pages as one folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from audit.files import replaced_dir, write_text
from audit.html_report import region_file, render_index, render_region
from audit.junit_report import render_junit
from audit.markdown_report import render_summary
from audit.report_model import AuditResults


@dataclass(frozen=True, slots=True)
class Written:
    index: Path
    summary: Path
    junit: Path
    regions: tuple[Path, ...]


def write_reports(
    results: AuditResults, directory: Path, previous: AuditResults | None = None
) -> Written:
    pages = {region_file(r.name): render_region(results, r) for r in results.regions}
    files = {
        "index.html": render_index(results),
        "summary.md": render_summary(results, previous),
        "junit.xml": render_junit(results),
    }
    with replaced_dir(directory / "regions") as staging:
        for name, text in pages.items():
            write_text(staging / Path(name).name, text)
    for name, text in files.items():
        write_text(directory / name, text)
    return Written(
        index=directory / "index.html",
        summary=directory / "summary.md",
        junit=directory / "junit.xml",
        regions=tuple(directory / name for name in pages),
    )
