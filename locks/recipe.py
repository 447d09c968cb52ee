"""Reader of locks/vllm.in, the lean vLLM environment's one recipe (syntax: its header).

The noxfile's `lock` session and tests/unit/test_lock_recipe.py load this file by path
(it is no package of the project). It needs only `packaging`, which nox and the lean
environment both have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


class RecipeError(ValueError):
    """The recipe is malformed, or does not fit a release's metadata."""


@dataclass(frozen=True)
class Line:
    names: tuple[str, ...]  # as written; several only for `A|B`
    source: str  # "vllm", "any" or a specifier of our own ({version} unexpanded)
    no_deps: bool
    lineno: int


@dataclass(frozen=True)
class Plan:
    """What the lock installs for one release: requirement strings for pip."""

    no_deps: list[str]  # pip install --no-deps
    resolved: list[str]  # pip install (resolved with their dependencies)
    constraints: list[str]  # pip -c: vLLM's other declared specifiers
    applied: list[str]  # one line per recipe line: the requirement and where it came from


def parse(text: str) -> list[Line]:
    """The recipe's lines; RecipeError names the first bad one."""
    lines: list[Line] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        no_deps = words[0] == "--no-deps"
        words = words[1:] if no_deps else words
        if len(words) != 2:
            raise RecipeError(f"line {lineno}: expected `[--no-deps] NAME SOURCE`: {raw.strip()}")
        names, source = tuple(words[0].split("|")), words[1]
        for name in names:
            if not _NAME.match(name):
                raise RecipeError(f"line {lineno}: not a package name: {name!r}")
            if canonicalize_name(name) in seen:
                raise RecipeError(f"line {lineno}: {name} is listed twice")
            seen.add(canonicalize_name(name))
        if len(names) > 1 and source != "vllm":
            raise RecipeError(f"line {lineno}: `A|B` needs SOURCE vllm, not {source!r}")
        if source not in {"vllm", "any"}:
            try:
                SpecifierSet(source.replace("{version}", "0"))
            except InvalidSpecifier:
                raise RecipeError(
                    f"line {lineno}: SOURCE must be vllm, any or a specifier: {source!r}"
                ) from None
        lines.append(Line(names, source, no_deps, lineno))
    if "vllm" not in seen:
        raise RecipeError("the recipe has no line for vllm itself")
    return lines


def declared(requires_dist: Iterable[str], environment: Mapping[str, str]) -> dict[str, str]:
    """vLLM's requirements that apply in `environment`: canonical name -> specifier.

    Requirements under a marker that does not hold (an extra of vLLM's, another
    platform) are left out; the extras a requirement asks for are dropped; several
    requirements of one name are intersected.
    """
    specs: dict[str, SpecifierSet] = {}
    for text in requires_dist:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise RecipeError(f"vLLM's metadata: unreadable Requires-Dist {text!r}") from exc
        if req.marker is not None and not req.marker.evaluate({**environment, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
    return {name: str(spec) for name, spec in specs.items()}


def plan(
    lines: list[Line],
    version: str,
    requires_dist: Iterable[str],
    environment: Mapping[str, str],
) -> Plan:
    """Expand the recipe for vLLM `version`, whose wheel declares `requires_dist`."""
    vllm_declares = declared(requires_dist, environment)
    no_deps: list[str] = []
    resolved: list[str] = []
    applied: list[str] = []
    own: set[str] = set()
    for line in lines:
        if line.source == "vllm":
            reqs = [
                (name, vllm_declares[canonicalize_name(name)])
                for name in line.names
                if canonicalize_name(name) in vllm_declares
            ]
            if not reqs:
                raise RecipeError(
                    f"line {line.lineno}: vLLM {version} declares no {'|'.join(line.names)} "
                    "(for this environment): its import chain changed; review locks/vllm.in"
                )
            origin = "vLLM's"
        elif line.source == "any":
            reqs, origin = [(line.names[0], "")], "any"
        else:
            reqs, origin = [(line.names[0], line.source.replace("{version}", version))], "own"
            own.add(canonicalize_name(line.names[0]))
        for name, spec in reqs:
            (no_deps if line.no_deps else resolved).append(name + spec)
            flag = "--no-deps " if line.no_deps else ""
            applied.append(f"{flag}{name}{spec}  ({origin})")
    constraints = [
        name + spec
        for name, spec in sorted(vllm_declares.items())
        if spec and name not in own and name != "vllm"
    ]
    return Plan(no_deps, resolved, constraints, applied)


def pins(lock_text: str) -> dict[str, str]:
    """A lock file's pins: canonical name -> version."""
    found: dict[str, str] = {}
    for raw in lock_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, sep, pinned = line.partition("==")
            if not sep:
                raise RecipeError(f"not a pin: {line!r}")
            found[canonicalize_name(name)] = pinned
    return found


def render(version: str, wheel: Mapping[str, Any], plan: Plan, frozen: str) -> str:
    """The lock file: its header, then every package of `pip freeze` pinned.

    `wheel` is vLLM's entry in pip's installation report (where its metadata came
    from); torch's local version (+cpu) is dropped so the pin fits any CPU index.
    """
    pinned = sorted(
        (
            line.split("+", 1)[0] if line.lower().startswith("torch==") else line
            for line in frozen.splitlines()
            if "==" in line and not line.startswith(("pip==", "setuptools==", "wheel=="))
        ),
        key=str.lower,
    )
    download = wheel["download_info"]
    archive = download.get("archive_info", {})
    digest = archive.get("hashes", {}).get("sha256") or archive.get("hash", "").partition("=")[2]
    header = [
        f"# Generated by `nox -s lock -- {version}` from locks/vllm.in and the Requires-Dist of",
        f"# {download['url'].rsplit('/', 1)[-1]}" + (f"\n# (sha256 {digest})." if digest else "."),
        f"# Every package of the lean vLLM {version} environment, pinned; installed with",
        "# pip --no-deps. Do not edit by hand.",
        "# The recipe's lines for this release (whose specifier: vLLM's, our own, any):",
        *(f"#   {line}" for line in plan.applied),
    ]
    return "\n".join(header + pinned) + "\n"
