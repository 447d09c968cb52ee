"""``python -m audit.upstream``: the upstream series' checks (``nox -s upstream``).

    python -m audit.upstream try FILE.py [--patch PATCH ...] [--all] [-- PYTEST_ARGS]

runs one vLLM-idiom test file in a tree of the installed release, with the patches
applied (none: the release as it is), and prints each test's outcome: the loop for
writing a test and its fix.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from audit.config import load_config
from audit.errors import AuditError
from audit.upstream.runs import run_tests
from audit.upstream.trees import TEST_FOLDER
from audit.upstream.workspace import open_workspace

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audit.upstream")
    sub = parser.add_subparsers(dest="command", required=True)
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
        config = load_config(ROOT / "pyproject.toml")
        version = os.environ.get("FENCE_AUDIT_VLLM_VERSION")
        if version:
            from dataclasses import replace

            config = replace(config, vllm_version=version)
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
    except AuditError as error:
        print(error.render(), file=sys.stderr)
        return int(error.exit_code)
    for outcome in run.outcomes:
        if args.all and outcome.outcome == "passed":
            continue
        print(f"{outcome.outcome:8} {outcome.test_id}")
        if outcome.message:
            print("         " + outcome.message.replace("\n", "\n         ")[:2000])
    counts = ", ".join(f"{run.count(o)} {o}" for o in ("passed", "failed", "error", "skipped"))
    print(f"{counts}; pytest exit {run.exit_code} in {run.seconds:.1f} s; log {run.log}; tree {tree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
