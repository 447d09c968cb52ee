"""One value of the configuration checked: its TOML kind, a non-empty string, a list
of strings, a vLLM release's version; and the order of releases.

A wrong value is a :class:`ConfigError` that names the key, the file, and what the value
should be, written as TOML writes it.
"""

from __future__ import annotations

import re
from typing import Any

from audit.core.errors import ConfigError

# A release as PyPI lists vLLM's: 0.33.0, 0.34.0rc1, 0.10.1.post1 (no local "+..." part).
_RELEASE = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")


def is_release(text: str) -> bool:
    """Whether ``text`` is a release's version, as PyPI lists vLLM's (it names files and
    folders: vllm-V.tar.gz, .nox/lean-vllm-V)."""
    return _RELEASE.fullmatch(text) is not None


def release_version(text: str, where: str) -> str:
    """``text`` when it is a release's version (:func:`is_release`); a ConfigError
    naming ``where`` it came from (its ``set by`` detail) otherwise."""
    if not is_release(text):
        raise ConfigError(
            f"the vLLM version {text!r} is not a release",
            details={"set by": where, "next": "give a release as PyPI lists it, such as 0.33.0"},
        )
    return text


def release_key(version: Any) -> tuple[int, ...] | None:
    """``"0.29.0"`` -> ``(0, 29, 0)``, for ordering releases; a local or pre-release
    suffix is ignored (``0.30.0rc1`` orders as 0.30.0). None if not a version."""
    if not isinstance(version, str):
        return None
    match = re.match(r"(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


# How TOML writes each kind a key may need, to say what a wrong value should be.
_TOML_KINDS = {
    str: ("a string", 'in quotes, such as "text"'),
    list: ("a list", 'in brackets, such as ["a", "b"]'),
    dict: ("a table", "a [section] or an inline { key = value }"),
    int: ("a whole number", "such as 2"),
    float: ("a number", "such as 90"),
    bool: ("true or false", "without quotes"),
}


def expect(value: Any, kind: type, where: str, source: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        wanted, written = _TOML_KINDS.get(kind, (f"a {kind.__name__}", ""))
        found = next((w for k, (w, _) in _TOML_KINDS.items() if type(value) is k), "")
        raise ConfigError(
            f"{where} must be {wanted}, not {found or type(value).__name__}: {value!r}"[:200],
            details={"config": source, "next": f"write {where} as {wanted}, {written}"},
        )
    return value


def string(table: dict[str, Any], key: str, source: str, where: str = "") -> str:
    label = f"{where}.{key}" if where else key
    if key not in table:
        raise ConfigError(
            f"missing key {label!r}", details={"config": source, "next": f"set {label}"}
        )
    value: str = expect(table[key], str, label, source)
    if not value.strip():
        default = "" if where and where != "deep" else ", or remove it to use the default"
        raise ConfigError(
            f"{label} must not be empty",
            details={"config": source, "next": f"give {label} a value{default}"},
        )
    return value


def strings(table: dict[str, Any], key: str, source: str, where: str = "") -> tuple[str, ...]:
    label = f"{where}.{key}" if where else key
    values = expect(table.get(key, []), list, label, source)
    for value in values:
        expect(value, str, f"each of {label}", source)
    return tuple(values)
