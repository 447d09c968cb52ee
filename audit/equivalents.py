"""Reviewed equivalent mutants: survivors no test can kill, each with a written reason.

``mutants/equivalents.toml`` lists them; each verdict names the sha256 of its
function's source as reviewed, and expires when that source changes (the mutant is
then a plain survivor again, and the reports say the verdict expired). A mutant
recorded as equivalent that a test kills shows the verdict was wrong: it stays
killed and the reports flag the record.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from audit.errors import ConfigError
from audit.model import Mutant, MutantResult
from audit.protocol import MutantStatus

_KEYS = {"id", "function_sha256", "reason", "reviewed"}


@dataclass(frozen=True, slots=True)
class Equivalent:
    id: str
    function_sha256: str  # of the function's source when the verdict was reviewed
    reason: str
    reviewed: str  # date, and by whom if the project wants it


def load_equivalents(path: Path | None) -> tuple[Equivalent, ...]:
    if path is None or not path.is_file():
        return ()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(
            "the equivalents file is not valid TOML",
            details={"file": str(path), "error": str(error)},
        ) from None
    records = data.get("equivalent", [])
    if not isinstance(records, list) or set(data) - {"equivalent"}:
        raise ConfigError(
            "the equivalents file holds only [[equivalent]] tables", details={"file": str(path)}
        )
    out = []
    for number, record in enumerate(records, 1):
        where = f"{path} [[equivalent]] {number}"
        if not isinstance(record, dict) or set(record) - _KEYS:
            raise ConfigError(
                "unknown key in an [[equivalent]]",
                details={"file": where, "allowed": ", ".join(sorted(_KEYS))},
            )
        values = {key: record.get(key) for key in _KEYS}
        for key, value in values.items():
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{key!r} must be a non-empty string", details={"file": where})
        out.append(Equivalent(**values))  # type: ignore[arg-type]
    return tuple(out)


def apply_equivalents(
    mutants: Sequence[Mutant],
    verdicts: Mapping[str, MutantResult],
    function_hashes: Mapping[str, str],
    equivalents: Sequence[Equivalent],
) -> tuple[dict[str, MutantResult], list[dict[str, Any]]]:
    """Survivors with a current verdict become EQUIVALENT, and so do mutants that no
    test reaches (a verdict can say why none can: dead code). Every record gets a
    state: ``applied``, ``expired`` (the function changed), ``killed`` (a test kills
    it: the verdict is wrong), ``not survived`` (another status: timeout, error) or
    ``absent`` (not in the run)."""
    by_id = {m.id: m for m in mutants}
    updated = dict(verdicts)
    records = []
    for equivalent in equivalents:
        mutant = by_id.get(equivalent.id)
        state = "absent"
        if mutant is not None:
            key = f"{mutant.module}:{mutant.function}" if mutant.module else mutant.function
            status = verdicts[mutant.id].status
            if function_hashes.get(key) != equivalent.function_sha256:
                state = "expired"
            elif status in (MutantStatus.SURVIVED, MutantStatus.NO_TESTS):
                state = "applied"
                updated[mutant.id] = replace(verdicts[mutant.id], status=MutantStatus.EQUIVALENT)
            elif status is MutantStatus.KILLED:
                state = "killed"
            else:
                state = "not survived"
        records.append(
            {
                "id": equivalent.id,
                "state": state,
                "reason": equivalent.reason,
                "reviewed": equivalent.reviewed,
            }
        )
    return updated, records
