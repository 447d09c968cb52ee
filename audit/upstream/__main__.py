"""``python -m audit.upstream``: the upstream series' checks (``nox -s upstream``).

    python -m audit.upstream check [--hunt-seconds N] [--no-audit] [--no-hunt] [--reports DIR]

runs every check of :mod:`audit.upstream.checks` on the installed release, writes
``REPORTS/upstream/{upstream.json,index.html,upstream.md}`` and exits 0 when every
check passed, 16 when one failed, 15 when a patch does not apply.

    python -m audit.upstream try FILE.py [--patch PATCH ...] [--all] [-- PYTEST_ARGS]

runs one vLLM-idiom test file in a tree of the installed release, with the patches
applied (none: the release as it is), and prints each test's outcome: the loop for
writing a test and its fix.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from audit.core.errors import AuditError, ConfigError, ExitCode
from audit.core.files import write_json, write_text
from audit.setup.config import Config, load_config
from audit.setup.findings import load_findings
from audit.upstream.checks import Options, run_checks
from audit.upstream.page import document, html_page, markdown
from audit.upstream.runs import run_tests
from audit.upstream.series import load_series
from audit.upstream.trees import TEST_FOLDER
from audit.upstream.workspace import open_workspace

ROOT = Path(__file__).resolve().parents[2]
SERIES = ROOT / "docs" / "upstream"
HUNT_SECONDS = 300


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audit.upstream")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="every check of the series on the installed release")
    check.add_argument("--hunt-seconds", type=int, default=HUNT_SECONDS)
    check.add_argument("--ruff", default="", help="ruff's executable (vLLM's lint and format)")
    check.add_argument("--no-audit", action="store_true", help="leave out the two audits")
    check.add_argument("--no-hunt", action="store_true", help="leave out the hunt")
    check.add_argument("--reports", type=Path, help="reports folder (default: reports)")
    check.add_argument("--series", type=Path, default=SERIES, help="default: docs/upstream")
    trying = sub.add_parser("try", help="run one vLLM-idiom test file, patched or not")
    trying.add_argument("file", type=Path)
    trying.add_argument("--patch", type=Path, action="append", default=[])
    trying.add_argument("--name", default="")
    trying.add_argument(
        "--all", action="store_true", help="run the whole offloading test folder, FILE in it"
    )
    trying.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    try:
        config = load_config(ROOT / "pyproject.toml")  # $FENCE_AUDIT_VLLM_VERSION applied
        if args.command == "check":
            return _check(config, args)
        return _try(config, args)
    except AuditError as error:
        print(error.render(), file=sys.stderr)
        return int(error.exit_code)
    except KeyboardInterrupt:
        print("fence-audit: upstream: interrupted; next: run it again", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)


def _check(config: Config, args: argparse.Namespace) -> int:
    reports = (args.reports or config.reports_dir) / "upstream"
    findings = {f.id: f for f in load_findings(config.findings_file, ROOT)}
    series = load_series(args.series, set(findings))
    options = Options(
        ruff=_executable(args.ruff) if args.ruff else "",
        hunt_seconds=args.hunt_seconds,
        audit=not args.no_audit,
        hunt=not args.no_hunt,
    )  # every input checked before anything is fetched or built
    workspace = open_workspace(config, reports.parent)
    print(
        f"upstream: {len(series.fixes)} fixes and {len(series.gap_tests)} gap test files "
        f"on vLLM {workspace.release}",
        flush=True,
    )
    outcome = run_checks(
        workspace, series, reports, options, findings, say=lambda s: print(s, flush=True)
    )
    data = document(outcome, series, findings)
    write_json(reports / "upstream.json", data)
    write_text(reports / "index.html", html_page(data))
    write_text(reports / "upstream.md", markdown(data))
    for check in outcome.checks:
        who = f"{check.finding}: " if check.finding else ""
        print(f"  {'ok    ' if check.ok else 'FAILED'} {who}{check.step}: {check.detail}")
    failed = [c for c in outcome.checks if not c.ok]
    print(f"upstream: report {reports / 'index.html'}; "
          + (f"{len(failed)} of {len(outcome.checks)} checks FAILED" if failed
             else f"all {len(outcome.checks)} checks passed"))  # fmt: skip
    return int(ExitCode.UPSTREAM_CHECK_FAILED) if failed else 0


def _executable(name: str) -> str:
    """``--ruff``'s program as an absolute path (the checks run it inside the trees)."""
    found = shutil.which(name)
    if found is None:
        raise ConfigError(
            f"--ruff {name} is not an executable",
            details={"next": "install ruff (nox -s upstream does), or leave --ruff out"},
        )
    return str(Path(found).resolve())


def _try(config: Config, args: argparse.Namespace) -> int:
    workspace = open_workspace(config, config.reports_dir)
    name = args.name or f"try-{args.file.stem}-{os.getpid()}"
    tree = workspace.tree(name, [args.file], args.patch)
    run = run_tests(
        tree,
        [TEST_FOLDER if args.all else f"{TEST_FOLDER}/{args.file.name}"],
        cache_dir=config.cache_dir,
        models=config.offline_models,
        log=tree.parent / f"{name}.log",
        extra_args=args.pytest_args,
    )
    for outcome in run.outcomes:
        if args.all and outcome.outcome == "passed":
            continue
        print(f"{outcome.outcome:8} {outcome.test_id}")
        if outcome.message:
            print("         " + outcome.message.replace("\n", "\n         ")[:2000])
    counts = ", ".join(f"{run.count(o)} {o}" for o in ("passed", "failed", "error", "skipped"))
    print(
        f"{counts}; pytest exit {run.exit_code} in {run.seconds:.1f} s; log {run.log}; tree {tree}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
