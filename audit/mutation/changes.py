"""Pull-request mode: the lines of the target that changed since a git ref, and the
mutants that lie on them (``fence-audit mutate --vllm-src CHECKOUT --since REF``).

The changed lines are those git reports between ``REF`` and the checkout's working
tree for the target module (``git diff --unified=0 -M --find-renames REF``), in the
numbering of the file as it is now: every added or modified line, and for a pure
deletion the two lines beside the deletion point (so a deleted ``if`` still draws the
mutants around it). A file renamed since ``REF`` is compared with its old path.

Mutants (mutmut's and the catalogue's) are judged when one of their changed lines is
a changed line: wholly inside one region, they count in that region; otherwise in the
group :data:`OUTSIDE`, scored apart (see DESIGN.md, "Pull-request mode").
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from audit.core.errors import ConfigError
from audit.core.inputs import resolved
from audit.mutation.catalogue_mutants import CatalogueMutants
from audit.setup.regions import Region, Span, module_functions

# The group of the changed code that lies in no region (or straddles one's edge): a
# region of audit.json, scored apart from the fence regions' overall score.
OUTSIDE = "changed-outside-regions"

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
# Options that keep a user's git configuration (colours, external diff tools, text
# conversion) out of the output this module parses.
_PLAIN = ("--no-color", "--no-ext-diff", "--no-textconv")


@dataclass(frozen=True, slots=True)
class ChangedCode:
    """What changed in the target between ``ref`` and the working tree."""

    ref: str  # as the user gave it
    commit: str  # the commit git resolved it to
    path: str  # the target, relative to the checkout
    old_path: str  # its path at ``ref`` (another one when renamed); "" when new since
    lines: frozenset[int]  # changed lines of the file as it is now
    deletions: tuple[int, ...]  # pure deletions: the line before each (0: the top)

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return line_ranges(self.lines)

    @property
    def renamed(self) -> bool:
        return bool(self.old_path) and self.old_path != self.path

    def describe(self) -> str:
        """``HEAD~1 (1a2b3c4d5e6f)``: the ref as given, with its commit."""
        return f"{self.ref} ({self.commit[:12]})"


def changed_since(checkout: Path, ref: str, path: str) -> ChangedCode:
    """The lines of ``checkout/path`` that changed since ``ref``; a checkout that is
    not a git repository, or a ref git does not know, is a ConfigError (exit 1)."""
    root = resolved(checkout, "--vllm-src")
    _git(root, ref, "rev-parse", "--git-dir", failure=_not_a_repository)
    if ref.startswith("-"):  # never read as an option of git's
        raise _unknown_ref(root, ref, "a ref does not start with '-'")
    commit = _git(
        root,
        ref,
        "rev-parse",
        "--verify",
        "--quiet",
        "--end-of-options",
        f"{ref}^{{commit}}",
        failure=_unknown_ref,
    ).strip()
    if not _git(root, ref, "ls-files", "--", path).strip():
        # git diff would not see it; and a folder that is not a vLLM checkout inside
        # another repository looks like this too.
        raise ConfigError(
            f"--since {ref}: git does not track {path}",
            details={
                "checkout": str(root),
                "next": f"git -C {root} add {path} (a new file is compared as added), or "
                "pass --vllm-src the root of a git checkout of vLLM",
            },
        )
    length = len((root / path).read_text(encoding="utf-8").splitlines())
    old_path = _old_path(root, ref, commit, path)
    paths = [path] if old_path in ("", path) else [old_path, path]
    diff = _git(
        root,
        ref,
        "diff",
        *_PLAIN,
        "--unified=0",
        "-M",
        "--find-renames",
        commit,
        "--",
        *paths,
    )
    lines, deletions = parse_hunks(diff, length)
    return ChangedCode(ref, commit, path, old_path, lines, deletions)


def parse_hunks(diff: str, length: int) -> tuple[frozenset[int], tuple[int, ...]]:
    """The changed lines (new numbering) of a ``--unified=0`` diff of one file of
    ``length`` lines, and the pure deletions (the line before each; 0: the top).

    A hunk ``+C,N`` with N > 0 adds or modifies lines C..C+N-1; ``+C,0`` deletes after
    line C, which marks lines C and C+1 (those that exist)."""
    lines: set[int] = set()
    deletions: list[int] = []
    for text in diff.splitlines():
        match = _HUNK.match(text)
        if match is None:
            continue
        start = int(match[1])
        count = 1 if match[2] is None else int(match[2])
        if count:
            lines.update(range(start, start + count))
        else:
            deletions.append(start)
            lines.update(n for n in (start, start + 1) if 1 <= n <= length)
    return frozenset(lines), tuple(deletions)


def line_ranges(lines: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted lines as inclusive ``(first, last)`` runs: {3, 4, 5, 9} -> (3, 5), (9, 9)."""
    runs: list[tuple[int, int]] = []
    for line in sorted(set(lines)):
        if runs and runs[-1][1] == line - 1:
            runs[-1] = (runs[-1][0], line)
        else:
            runs.append((line, line))
    return tuple(runs)


def functions_holding(source: str, lines: Iterable[int]) -> tuple[str, ...]:
    """The functions (module functions, methods of module classes: what mutmut
    mutates) whose text holds one of ``lines``, by qualified name."""
    wanted = set(lines)
    return tuple(
        name for name, start, end in module_functions(source) if wanted & set(range(start, end + 1))
    )


def outside_group(changed: ChangedCode, source: str, regions: Iterable[Region]) -> Region:
    """The changed lines no region holds, inside a function (no mutant lies elsewhere),
    as a region of their own: its coverage and page come with the regions'."""
    inside = {line for region in regions for line in region.lines}
    outside = changed.lines - inside
    spans = [
        Span(name, first, last, f"changed since {changed.ref}")
        for name, start, end in module_functions(source)
        for first, last in line_ranges(outside & set(range(start, end + 1)))
    ]
    return Region(
        OUTSIDE,
        f"code changed since {changed.describe()} outside every fence region: scored apart, "
        "not in the overall score",
        tuple(sorted(spans, key=lambda span: span.start)),
    )


def placer(
    changed: ChangedCode, regions: Iterable[Region], judged: Iterable[str]
) -> Callable[[Iterable[int]], str | None]:
    """A mutant's group from its changed lines: None when none is a changed line (or it
    lies in a region the run leaves out); the region holding them all; else
    :data:`OUTSIDE`. ``regions``: every fence region; ``judged``: the run's names."""
    region_of = {line: region.name for region in regions for line in region.lines}
    names = set(judged)

    def place(lines: Iterable[int]) -> str | None:
        lines = tuple(lines)
        if changed.lines.isdisjoint(lines):
            return None
        owners = {region_of.get(line, "") for line in lines}
        if len(owners) == 1 and "" not in owners:
            name = owners.pop()
            return name if name in names else None
        return OUTSIDE

    return place


def changed_catalogue(catalogue: CatalogueMutants, changed: ChangedCode) -> CatalogueMutants:
    """The catalogue entries whose changes touch a changed line of the target (an entry
    of another module never does). Entries that did not apply (stale, and the like) stay
    listed: one the change made stale is news to the reviewer."""
    mutants = tuple(
        m
        for m in catalogue.mutants
        if not m.module and not changed.lines.isdisjoint(m.changed_lines)
    )
    dropped = {m.id for m in catalogue.mutants} - {m.id for m in mutants}
    entries = {key: entry for key, entry in catalogue.entries.items() if key not in dropped}
    return replace(catalogue, mutants=mutants, entries=entries)


def record(changed: ChangedCode) -> dict[str, Any]:
    """``since`` in audit.json (its ``score`` is added by :mod:`audit.results.scores`)."""
    return {
        "ref": changed.ref,
        "commit": changed.commit,
        "path": changed.path,
        "old_path": changed.old_path or None,
        "lines": [list(run) for run in changed.ranges],
        "deletions": list(changed.deletions),
    }


# --- git ---------------------------------------------------------------------------


def _git(
    root: Path, ref: str, *args: str, failure: Callable[..., ConfigError] | None = None
) -> str:
    try:
        process = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            check=False,
        )
    except FileNotFoundError:
        raise ConfigError(
            "--since needs git, which is not on PATH",
            details={"next": "install git, or drop --since to audit the whole fence"},
        ) from None
    if process.returncode != 0:
        error = failure or _git_failed
        raise error(root, ref, process.stderr.strip() or f"git {args[0]} exit {process.returncode}")
    return process.stdout


def _old_path(root: Path, ref: str, commit: str, path: str) -> str:
    """The target's path at ``commit``: its own, the one it was renamed from, or ""."""
    renames = _git(
        root,
        ref,
        "diff",
        *_PLAIN,
        "--name-status",
        "-z",
        "-M",
        "--find-renames",
        "--diff-filter=R",
        "--relative",
        commit,
    )
    for old, new in _renames(renames):
        if new == path:
            return old
    exists = subprocess.run(
        ["git", "-C", str(root), "cat-file", "-e", f"{commit}:./{path}"],
        capture_output=True,
        check=False,
    )
    return path if exists.returncode == 0 else ""


def _renames(name_status: str) -> Iterator[tuple[str, str]]:
    """(old, new) of each ``R`` entry of ``--name-status -z`` output."""
    fields = name_status.split("\0")
    index = 0
    while index + 2 < len(fields):
        status = fields[index]
        if status.startswith(("R", "C")):
            yield fields[index + 1], fields[index + 2]
            index += 3
        else:
            index += 2


def _not_a_repository(root: Path, ref: str, why: str) -> ConfigError:
    return ConfigError(
        f"--since {ref}: the checkout is not a git repository",
        details={
            "checkout": str(root),
            "git": why.splitlines()[0] if why else "",
            "next": "pass --vllm-src a git checkout of vLLM (git clone), or drop --since "
            "to audit the whole fence",
        },
    )


def _unknown_ref(root: Path, ref: str, why: str) -> ConfigError:
    return ConfigError(
        f"--since {ref}: git does not know {ref!r}",
        details={
            "checkout": str(root),
            "next": f"fetch it first (git -C {root} fetch origin {ref}), or pass a branch, "
            f"tag or commit the checkout has (git -C {root} log --oneline)",
        },
    )


def _git_failed(root: Path, ref: str, why: str) -> ConfigError:
    return ConfigError(
        f"--since {ref}: git failed",
        details={
            "checkout": str(root),
            "git": why.splitlines()[0] if why else "",
            "next": "run the git command by hand",
        },
    )
