"""How long the suite's random workloads take, against an older revision of this project.

``nox -s workloads-bench -- --against REV [--rounds N]`` checks REV out into a
temporary git worktree and runs the random workloads (``suite.random-workloads`` of
each tree's own defaults, under the ``ci`` profile) of REV and of this checkout in
turn, N rounds after one untimed run of each, alternating which goes first, in the
same lean environment. A run's time is the sum of its tests' times as pytest reports
them (setup, call, teardown), not the interpreter's start or collection. It prints
every round, the means and the ratio, and writes ``reports/workloads-bench.json``.
Issue 16 bounds the ``ci`` profile's growth at 2x: this is where that figure comes
from.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from xml.etree import ElementTree

from audit.arguments import Parser, whole_number
from audit.core import outputs
from audit.core.errors import AuditError, ConfigError
from audit.core.files import write_json

ROOT = Path(__file__).resolve().parents[2]
REPORT = "workloads-bench.json"
DEFAULTS = Path("audit/data/defaults.toml")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="nox -s workloads-bench --",
        description="Time the random workloads of this checkout against those of REV.",
    )
    parser.add_argument("--against", required=True, metavar="REV", help="a git revision")
    parser.add_argument("--rounds", type=whole_number(1), default=5, help="rounds (default 5)")
    parser.add_argument(
        "--reports", type=Path, default=ROOT / "reports", help="where the JSON goes"
    )
    return parser


def workload_tests(tree: Path) -> list[str]:
    """The random workloads' pytest ids in ``tree``, from its own defaults."""
    try:
        suite = tomllib.loads((tree / DEFAULTS).read_text())["suite"]
        ids = suite["random-workloads"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(
            "the defaults name no suite.random-workloads",
            details={
                "file": str(tree / DEFAULTS),
                "error": str(error),
                "next": "choose a revision that has random workloads configured",
            },
        ) from None
    return [test.removeprefix("project:") for test in ids]


def run_once(tree: Path, tests: list[str], junit: Path) -> float:
    """Run ``tests`` in ``tree``; the sum of their times as pytest reports them."""
    env = {**os.environ, "HYPOTHESIS_PROFILE": "ci"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, f"--junitxml={junit}", *tests],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode != 0:
        raise ConfigError(
            f"the random workloads failed (pytest exit {done.returncode})",
            details={
                "tree": str(tree),
                "next": f"run python -m pytest {' '.join(tests)} there to see why",
            },
        )
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    return sum(float(case.get("time", "0")) for case in cases)


def bench(against: str, rounds: int, reports: Path) -> dict[str, object]:
    resolved = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{against}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if resolved.returncode != 0:
        raise ConfigError(
            f"--against {against}: git knows no such revision",
            details={
                "repository": str(ROOT),
                "next": "give a branch, tag or commit of this repository (git log --oneline)",
            },
        )
    commit = resolved.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="fence-audit-workloads-") as scratch:
        old = Path(scratch) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(old), commit],
            check=True,
        )
        try:
            trees = {"before": old, "now": ROOT}
            tests = {label: workload_tests(tree) for label, tree in trees.items()}
            times: dict[str, list[float]] = {"before": [], "now": []}
            # One untimed run of each first: a tree's first run pays one-time costs
            # (its Hugging Face home, vLLM's first config) that a CI run pays once too.
            for label, tree in trees.items():
                run_once(tree, tests[label], Path(scratch) / f"{label}-warm-up.xml")
            for index in range(rounds):
                order = ["before", "now"] if index % 2 == 0 else ["now", "before"]
                for label in order:
                    junit = Path(scratch) / f"{label}-{index}.xml"
                    times[label].append(run_once(trees[label], tests[label], junit))
                print(
                    f"workloads-bench: round {index + 1}: before {times['before'][-1]:.2f} s, "
                    f"now {times['now'][-1]:.2f} s",
                    flush=True,
                )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False
            )
    means = {label: statistics.mean(values) for label, values in times.items()}
    result: dict[str, object] = {
        "against": against,
        "against_commit": commit,
        "rounds": rounds,
        "tests": tests,
        "seconds": times,
        "mean_s": means,
        "ratio_now_to_before": means["now"] / means["before"],
    }
    outputs.claim(reports, REPORT)
    write_json(reports / REPORT, result)
    return result


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM too removes the worktree on its way out


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    try:
        args = build_parser().parse_args(argv)
        outputs.check_reports_dir(args.reports)
        result = bench(args.against, args.rounds, args.reports)
    except AuditError as error:
        print(error.render(), file=sys.stderr)
        return int(error.exit_code)
    except KeyboardInterrupt:
        print("workloads-bench: interrupted", file=sys.stderr)
        return 130
    means = result["mean_s"]
    assert isinstance(means, dict)
    print(
        f"workloads-bench: mean before {means['before']:.2f} s, now {means['now']:.2f} s; "
        f"now / before = {result['ratio_now_to_before']:.2f} "
        f"({args.reports / REPORT})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
