"""Text from a run shown to a person: what would not show as itself made visible.

Failure text, test ids and diffs come from tests and from vLLM's sources. A test's
ANSI colours, a form feed in a diff, or a lone surrogate from undecodable bytes are
legal there; in a report they are invisible or worse (XML 1.0 forbids most C0
characters even as references, so one ESC made a CI system reject the whole JUnit
file). A bidirectional override can reorder what a reviewer reads after it. Each of
those characters is shown as its Python escape instead (``\\x1b``, ``\\u202e``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# C0 controls but tab, newline and carriage return (callers decide what a line break
# becomes); DEL and the C1 controls; the bidirectional marks, embeddings, overrides
# and isolates; the line and paragraph separators; lone surrogates; and the two
# non-characters XML excludes.
INVISIBLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e"
    "\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)


def visible(text: str) -> str:
    """``text`` with each :data:`INVISIBLE` character as its escape."""
    return INVISIBLE.sub(lambda found: found[0].encode("unicode_escape").decode("ascii"), text)


def visible_lines(text: str) -> list[str]:
    """``text``'s lines, each :func:`visible`: split at line feeds only (``splitlines``
    would also break at a form feed or a file separator, which a diff shows as such);
    a carriage return that ends no line shown as ``\\r``."""
    text = text.replace("\r\n", "\n").replace("\r", "\\r")
    return visible(text).split("\n")


def first_of(names: Sequence[str], shown: int) -> str:
    """The first ``shown`` of ``names``, comma-separated, and how many more there are
    (a message names a few of what may be thousands)."""
    rest = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {rest} more" if rest > 0 else "")
