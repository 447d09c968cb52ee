"""``junit.xml``: one test case per mutant, so any CI interface lists the survivors.

A killed mutant passes; a survivor or a timeout is a failure (the fence suite did
not catch it); a mutant that could not be judged is an error; one that no test
covers is skipped, and so is a stale catalogue entry (with its reason). One
``<testsuite>`` per region.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from audit.core.protocol import MutantStatus
from audit.core.text import visible
from audit.results.view import AuditResults, MutantRecord

_SKIPPED = {
    "stale": "STALE catalogue entry",
    "carried": "this release carries this bug",
    "not yet": "not in this release yet",
}


def render_junit(results: AuditResults) -> str:
    root = ET.Element("testsuites", name="fence-audit")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for region in results.regions:
        mutants = results.mutants_of(region.name)
        suite = ET.SubElement(root, "testsuite", name=f"fence-audit.{region.name}")
        counts = {"tests": len(mutants), "failures": 0, "errors": 0, "skipped": 0}
        time_s = 0.0
        for mutant in mutants:
            kind = _case(suite, mutant)
            if kind:
                counts[kind] += 1
            time_s += mutant.duration_s
        for entry in results.catalogue:
            if entry.region == region.name and entry.state != "applied":
                # listed, never dropped: a skipped case
                case = ET.SubElement(
                    suite, "testcase", classname=f"fence-audit.{region.name}", name=entry.id
                )
                why = _SKIPPED[entry.state]
                ET.SubElement(case, "skipped", message=f"{why}: {entry.reason}")
                counts["tests"] += 1
                counts["skipped"] += 1
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", f"{time_s:.3f}")
    for key, value in totals.items():
        root.set(key, str(value))
    for element in root.iter():  # XML 1.0 forbids most control characters, even as &#x1b;
        element.text = visible(element.text) if element.text else element.text
        for name, attribute in element.attrib.items():
            element.set(name, visible(attribute))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _case(suite: ET.Element, mutant: MutantRecord) -> str:
    """Add the mutant's test case; return the JUnit count it adds to ("" for a pass)."""
    case = ET.SubElement(
        suite,
        "testcase",
        classname=f"fence-audit.{mutant.region}.{mutant.function}",
        name=mutant.id,
        line=str(mutant.line),
        time=f"{mutant.duration_s:.3f}",
    )
    label = mutant.title or mutant.operator
    if mutant.status is MutantStatus.KILLED:
        ET.SubElement(case, "system-out").text = f"killed by {mutant.killed_by}\n"
        return ""
    if mutant.status is MutantStatus.SURVIVED:
        failure = ET.SubElement(
            case,
            "failure",
            message=f"mutant survived: {label} at line {mutant.line}; no test failed",
            type="survived",
        )
        failure.text = mutant.diff
        return "failures"
    if mutant.status is MutantStatus.TIMEOUT:
        failure = ET.SubElement(
            case, "failure", message=f"mutant timed out: {mutant.failure}", type="timeout"
        )
        failure.text = mutant.diff
        return "failures"
    if mutant.status is MutantStatus.ERROR:
        error = ET.SubElement(case, "error", message="mutant could not be judged", type="error")
        error.text = mutant.failure
        return "errors"
    if mutant.status is MutantStatus.EQUIVALENT:
        ET.SubElement(case, "skipped", message=f"reviewed equivalent: {mutant.equivalence}")
        return "skipped"
    ET.SubElement(case, "skipped", message="no test of the suite runs the mutated lines")
    return "skipped"
