"""locks/vllm.in parses, and every committed lock pins its vLLM and the recipe's packages."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCKS = Path(__file__).resolve().parents[2] / "locks"
LOCK_FILES = sorted(LOCKS.glob("vllm-*.txt"))


def _reader() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock_recipe", LOCKS / "recipe.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


recipe = _reader()
LINES = recipe.parse((LOCKS / "vllm.in").read_text())


@pytest.mark.parametrize(
    "text",
    [
        "torch ==2.13.0\n",  # no line for vllm itself
        "vllm =={version}\nnumpy\n",  # no SOURCE
        "vllm =={version}\nnumpy latest\n",  # SOURCE neither vllm, any nor a specifier
        "vllm =={version}\na|b any\n",  # alternatives need SOURCE vllm
        "vllm =={version}\nnumpy vllm\nNumPy any\n",  # listed twice
    ],
)
def test_malformed_recipes_are_refused(text: str) -> None:
    with pytest.raises(recipe.RecipeError):
        recipe.parse(text)


def test_the_recipe_takes_vllms_specifiers_for_this_environment() -> None:
    lines = recipe.parse(
        "--no-deps vllm =={version}\nopenai-harmony|oss-harmony vllm\n"
        "fastapi vllm\ntorch ==2.13.0\nuvloop any\n"
    )
    requires_dist = [
        "oss-harmony>=0.0.11",
        "fastapi[standard]<0.137,>=0.133",
        'fastapi<0.136; python_version < "3.10"',
        "torch==2.14.0",
        "huggingface_hub>=1.31",
        'zentorch==2.14.0.1; extra == "zen"',
    ]
    plan = recipe.plan(lines, "0.33.0", requires_dist, {"python_version": "3.11"})
    assert plan.no_deps == ["vllm==0.33.0"]
    assert plan.resolved == [
        "oss-harmony>=0.0.11",
        "fastapi<0.137,>=0.133",
        "torch==2.13.0",
        "uvloop",
    ]
    assert plan.constraints == [
        "fastapi<0.137,>=0.133",
        "huggingface-hub>=1.31",
        "oss-harmony>=0.0.11",
    ]
    with pytest.raises(recipe.RecipeError, match="declares no fastapi"):
        recipe.plan(lines, "0.33.0", ["oss-harmony"], {"python_version": "3.11"})


def test_all_supported_releases_are_locked() -> None:
    versions = {path.stem.removeprefix("vllm-") for path in LOCK_FILES}
    assert versions >= {"0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"}
    assert not list(LOCKS.glob("vllm-*.in")), "one recipe, locks/vllm.in, for every release"


@pytest.mark.parametrize("lock", LOCK_FILES, ids=lambda path: path.stem)
def test_a_lock_pins_its_vllm_and_the_recipes_packages(lock: Path) -> None:
    text = lock.read_text()
    pins = recipe.pins(text)
    version = lock.stem.removeprefix("vllm-")
    assert pins["vllm"] == version
    assert "locks/vllm.in" in text.splitlines()[0]
    for line in LINES:
        assert any(canonicalize_name(name) in pins for name in line.names), line
    # Each specifier the lock was resolved with (its header) holds for its pin.
    applied = [row[4:].rsplit("  (", 1)[0] for row in text.splitlines() if row.startswith("#   ")]
    assert len(applied) >= len(LINES)
    for row in applied:
        req = Requirement(row.removeprefix("--no-deps "))
        assert req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True), row
