"""Fixtures of the report tests."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from audit.results.report_model import load_results
from audit.results.view import AuditResults

RESULTS = Path(__file__).parent / "data" / "results.json"


@pytest.fixture
def results_on_disk(tmp_path: Path) -> AuditResults:
    """``data/results.json`` with its audited file present, as after a real run.

    The reports stage renders mutation.json over the audited source, and the fixture's
    target (``/src/toypkg/fence.py``) exists nowhere. The file is rebuilt from the
    lines the results hold (any other line blank), and the view points at it.
    """
    results = load_results(RESULTS)
    numbered = {line.number: line.text for f in results.functions for line in f.lines}
    text = "".join(f"{numbered.get(n, '')}\n" for n in range(1, max(numbered) + 1))
    target = tmp_path / "src" / "toypkg" / "fence.py"
    target.parent.mkdir(parents=True)
    target.write_text(text, encoding="utf-8")
    return dataclasses.replace(
        results,
        target_path=str(target),
        target_sha256=hashlib.sha256(text.encode()).hexdigest(),
    )
