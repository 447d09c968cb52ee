"""Compiling a mutated function alone gives the code the whole mutated module gives.

The executor compiles only the mutated function (with its classes' headers and the
module's imports, every line in place) instead of vLLM's whole scheduler module; this
checks, for every in-region mutant and catalogue entry of the installed vLLM, that the code
object is the same: bytecode, constants, names, line table, flags, free variables.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from audit.core import environment
from audit.core.protocol import apply_edits
from audit.judging.jobs import function_frame
from audit.mutation import catalogue_entries, catalogue_mutants, mutmut_adapter
from audit.mutation.mutants import build_mutants
from audit.setup.config import load_config
from audit.setup.regions import resolve_regions
from audit.testproc.codeswap import find_code, function_text


def identity(code: types.CodeType) -> tuple[object, ...]:
    consts = tuple(
        identity(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
        for c in code.co_consts
    )
    return (
        code.co_code,
        consts,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        code.co_flags,
        code.co_qualname,
        code.co_firstlineno,
        code.co_linetable,
    )


def test_function_alone_compiles_to_the_modules_code(project_root: Path) -> None:
    config = load_config(project_root / "pyproject.toml")
    installed = environment.installed_vllm(config.vllm_version)
    path = environment.installed_file(installed, config.target)
    source = path.read_text()
    regions = resolve_regions(source, config.regions, filename=str(path))
    mutants = list(build_mutants(source, str(path), regions, {}).mutants)
    entries = catalogue_entries.load_catalogue(project_root / "mutants" / "catalogue")
    built = catalogue_mutants.build_catalogue_mutants(entries, source, str(path), regions, {})
    mutants += [m for m in built.mutants if not m.module]
    assert len(mutants) > 200
    frames = {m.function: function_frame(source, m.function) for m in mutants}
    for mutant in mutants:
        frame = frames[mutant.function]
        assert frame is not None, mutant.function
        alone = function_text(source, mutant.edits, frame)
        assert alone is not None, mutant.id
        whole = compile(apply_edits(source, mutant.edits), str(path), "exec")
        expected = find_code(whole, mutant.function)
        actual = find_code(compile(alone, str(path), "exec"), mutant.function)
        assert identity(actual) == identity(expected), mutant.id


def test_rendering_the_node_alone_gives_mutmuts_edits(
    project_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation renders only the mutated node (``_spliced``), not the whole function
    as mutmut's ``deep_replace`` does; on the fence regions of the installed vLLM both give
    the same edits, mutation for mutation."""
    config = load_config(project_root / "pyproject.toml")
    installed = environment.installed_vllm(config.vllm_version)
    path = environment.installed_file(installed, config.target)
    source = path.read_text()
    regions = resolve_regions(source, config.regions, filename=str(path))
    functions = sorted({f for region in regions for f in region.functions})
    spliced = mutmut_adapter.generate(source, functions)
    monkeypatch.setattr(mutmut_adapter, "_spliced", lambda *args: None)
    rendered = mutmut_adapter.generate(source, functions)
    assert len(spliced) > 500
    assert spliced == rendered
