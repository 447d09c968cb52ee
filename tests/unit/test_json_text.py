"""The one JSON layout every file of the audit is written in
(:func:`audit.core.files.json_text`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from audit.core.files import json_text, write_json

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.integers(), inner, max_size=4)
    ),
    max_leaves=25,
)


@given(documents)
def test_it_reads_back_as_json_itself_would_have_written_it(document: Any) -> None:
    text = json_text(document)
    assert text.endswith("\n")
    assert json.loads(text) == json.loads(json.dumps(document))


def test_each_mutant_test_and_source_line_is_one_line(tmp_path: Path) -> None:
    mutant = {"id": "f:assignment@1#0", "lines": [3, 4], "failure": "Traceback\n  boom"}
    document = {
        "format": 9,
        "regions": {"flush": {"killed": 2, "judged": 2}},
        "mutants": [mutant, {**mutant, "id": "f:assignment@2#0"}],
        "source": ["def f():", "    return 1"],
        "catalogue": [],
    }
    write_json(tmp_path / "audit.json", document)
    lines = (tmp_path / "audit.json").read_text(encoding="utf-8").splitlines()
    assert lines == [
        "{",
        ' "format": 9,',
        ' "regions": {',
        '  "flush": {"killed": 2, "judged": 2}',
        " },",
        ' "mutants": [',
        "  " + json.dumps(mutant) + ",",
        "  " + json.dumps({**mutant, "id": "f:assignment@2#0"}),
        " ],",
        ' "source": [',
        '  "def f():",',
        '  "    return 1"',
        " ],",
        ' "catalogue": []',
        "}",
    ]
