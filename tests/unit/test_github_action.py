"""The composite action (action.yml) and the workflow, checked where actionlint does not.

actionlint lints workflows, not an action's metadata: these tests check that every
input the action reads is declared (and every declared one read), that inputs reach
its scripts only through env, that each step's references resolve, and that the
scripts it names exist. Its first step's script (.github/scripts/action_config.sh)
runs here against real git repositories in a temporary folder (file:// remotes, no
network).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")  # pinned in every lean vLLM environment (vLLM needs it)

ROOT = Path(__file__).parents[2]
ACTION = ROOT / "action.yml"
WORKFLOW = ROOT / ".github" / "workflows" / "fence-audit.yml"
CONFIG_SCRIPT = ROOT / ".github" / "scripts" / "action_config.sh"
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)


def load(path: Path) -> dict[Any, Any]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def expressions(node: object) -> list[str]:
    """The text of every ${{ ... }} in a parsed YAML node."""
    if isinstance(node, dict):
        return [e for key, value in node.items() for e in expressions(key) + expressions(value)]
    if isinstance(node, list):
        return [e for item in node for e in expressions(item)]
    return EXPRESSION.findall(node) if isinstance(node, str) else []


def test_every_input_the_action_reads_is_declared_and_every_declared_one_read() -> None:
    action = load(ACTION)
    declared = set(action["inputs"])
    read = {
        name
        for text in expressions(action["runs"]) + expressions(action["outputs"])
        for name in re.findall(r"\binputs\.([A-Za-z0-9_-]+)", text)
    }
    assert read <= declared, f"read but not declared: {sorted(read - declared)}"
    assert declared <= read, f"declared but never read: {sorted(declared - read)}"
    assert {"base", "vllm-version", "vllm-src", "github-token", "comment"} <= declared
    assert set(action["outputs"]) >= {"score", "report-dir"}


def test_inputs_reach_the_shell_only_through_env() -> None:
    # An expression spliced into a script is a script injection (a branch name, say).
    for step in load(ACTION)["runs"]["steps"]:
        if "run" in step:
            assert "${{" not in step["run"], f"step {step.get('name')!r} splices an expression"
            assert step.get("shell") == "bash", "a composite action's run step needs a shell"


def test_every_step_reference_names_an_earlier_step() -> None:
    action = load(ACTION)
    steps = action["runs"]["steps"]
    seen: set[str] = set()
    for step in steps:
        for text in expressions({k: v for k, v in step.items() if k != "id"}):
            for name in re.findall(r"\bsteps\.([A-Za-z0-9_-]+)\.", text):
                assert name in seen, f"step {step.get('name')!r} reads steps.{name} before it runs"
        if "id" in step:
            seen.add(step["id"])
    for output in action["outputs"].values():
        for name in re.findall(r"\bsteps\.([A-Za-z0-9_-]+)\.", output["value"]):
            assert name in seen


def test_the_scripts_named_exist() -> None:
    action_text = ACTION.read_text(encoding="utf-8")
    named = re.findall(r"\$GITHUB_ACTION_PATH/([\w./-]+)", action_text)
    named += re.findall(r"(\.github/scripts/[\w.-]+)", WORKFLOW.read_text(encoding="utf-8"))
    assert named
    for path in named:
        assert (ROOT / path).is_file(), path


def test_the_workflow_audits_each_release_apart_and_merges_whatever_came_of_them() -> None:
    workflow = load(WORKFLOW)
    assert workflow["permissions"] == {"contents": "read"}
    jobs = workflow["jobs"]
    audit = jobs["audit"]
    assert audit["strategy"]["fail-fast"] is False
    assert "needs.releases.outputs.versions" in audit["strategy"]["matrix"]["version"]
    upload = next(s for s in audit["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["with"]["include-hidden-files"] is True
    assert "matrix.version" in upload["with"]["name"]
    page = jobs["releases-page"]
    assert "audit" in page["needs"]
    assert "!cancelled()" in page["if"]
    assert any("--page-only" in s.get("run", "") for s in page["steps"])


def test_a_sharded_release_is_judged_by_its_shards_and_gated_by_one_merge() -> None:
    workflow = load(WORKFLOW)
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert "shards" in triggers["workflow_dispatch"]["inputs"]
    jobs = workflow["jobs"]
    audit, merge, costs = jobs["audit"], jobs["merge"], jobs["costs"]
    assert "needs.releases.outputs.shards" in audit["strategy"]["matrix"]["shard"]
    run = next(s["run"] for s in audit["steps"] if s.get("id") == "audit")
    assert '--shard "$SHARD/$SHARDS"' in run
    assert "--shard-costs" in run
    # every shard deals by the same durations, timed once per release
    assert "needs.releases.outputs.count != '1'" in costs["if"]
    assert any("nox -s coverage" in s.get("run", "") for s in costs["steps"])
    assert "costs" in audit["needs"]
    # a shard's artifact is not a release's: the releases page reads fence-audit-vllm-*
    upload = next(s for s in audit["steps"] if "upload-artifact" in s.get("uses", ""))
    assert "fence-audit-shard-{0}-{1}" in upload["with"]["name"]
    download = next(s for s in merge["steps"] if "pattern" in s.get("with", {}))
    assert download["with"]["pattern"] == "fence-audit-shard-${{ matrix.version }}-*"
    assert any("nox -s merge" in s.get("run", "") for s in merge["steps"])
    assert "needs.releases.outputs.count != '1'" in merge["if"]
    assert "!cancelled()" in merge["if"]
    page = jobs["releases-page"]
    assert "merge" in page["needs"]
    pattern = next(s for s in page["steps"] if "download-artifact" in s.get("uses", ""))
    assert pattern["with"]["pattern"] == "fence-audit-vllm-*"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_action_s_shell_passes_shellcheck(tmp_path: Path) -> None:
    scripts = [CONFIG_SCRIPT]
    for index, step in enumerate(load(ACTION)["runs"]["steps"]):
        if "run" in step:
            script = tmp_path / f"step-{index}.sh"
            script.write_text("#!/usr/bin/env bash\n" + step["run"], encoding="utf-8")
            scripts.append(script)
    done = subprocess.run(
        ["shellcheck", *map(str, scripts)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout


# --- action_config.sh -------------------------------------------------------------------


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env=GIT_ENV
    )
    return done.stdout.strip()


GIT_ENV = {
    "PATH": os.environ.get("PATH", ""),
    "HOME": "/nonexistent",  # no user's git configuration
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A vLLM stand-in with three commits on main, and a branch `base` at the first."""
    repo = tmp_path_factory.mktemp("upstream")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "uploadpack.allowAnySHA1InWant", "true")  # as GitHub serves shas
    shas = []
    for n in range(3):
        (repo / "scheduler.py").write_text(f"x = {n}\n")
        git(repo, "add", "scheduler.py")
        git(repo, "commit", "-q", "-m", f"commit {n}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "branch", "base", shas[0])
    return repo, shas


def clone(upstream: Path, into: Path, *options: str) -> Path:
    git(into.parent, "clone", "-q", *options, f"file://{upstream}", into.name)
    return into


def configure(tmp_path: Path, **inputs: str) -> tuple[int, dict[str, str], str]:
    output = tmp_path / "github-output"
    output.write_text("")
    env = {
        **GIT_ENV,
        "GITHUB_ACTION_PATH": str(ROOT),
        "GITHUB_OUTPUT": str(output),
        "RUNNER_TEMP": str(tmp_path / "runner-temp"),
        "PY": sys.executable,
        "COMMENT": "true",
        "VLLM_VERSION": "",
        "VLLM_SRC": ".",
        **inputs,
    }
    done = subprocess.run(
        ["bash", str(CONFIG_SCRIPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    values = dict(line.split("=", 1) for line in output.read_text().splitlines())
    return done.returncode, values, done.stdout + done.stderr


def configured_version() -> str:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return str(pyproject["tool"]["fence-audit"]["vllm-version"])


def test_a_full_checkout_resolves_every_value(
    tmp_path: Path, upstream: tuple[Path, list[str]]
) -> None:
    repo, shas = upstream
    checkout = clone(repo, tmp_path / "vllm")
    code, values, log = configure(tmp_path, BASE=shas[0], VLLM_SRC="vllm")
    assert code == 0, log
    assert values["version"] == configured_version()
    assert values["src"] == str(checkout.resolve())
    assert values["base"] == shas[0]
    assert values["reports"] == str(tmp_path / "runner-temp" / "fence-audit-reports")
    assert re.fullmatch(r"[0-9a-f]{16}", values["lock-hash"])
    assert "fetching" not in log


def test_a_shallow_checkout_fetches_the_base_commit(
    tmp_path: Path, upstream: tuple[Path, list[str]]
) -> None:
    repo, shas = upstream
    checkout = clone(repo, tmp_path / "vllm", "--depth", "1")
    code, values, log = configure(tmp_path, BASE=shas[0], VLLM_SRC="vllm")
    assert code == 0, log
    assert "fetching the base commit" in log
    assert values["base"] == shas[0]
    # what fence-audit runs on it: a diff of the checkout against the base
    assert git(checkout, "diff", "--name-only", values["base"]) == "scheduler.py"


def test_a_base_given_as_a_branch_only_the_remote_has_becomes_its_sha(
    tmp_path: Path, upstream: tuple[Path, list[str]]
) -> None:
    repo, shas = upstream
    clone(repo, tmp_path / "vllm", "--depth", "1", "--single-branch", "--branch", "main")
    code, values, log = configure(tmp_path, BASE="base", VLLM_SRC="vllm")
    assert code == 0, log
    assert values["base"] == shas[0]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"VLLM_VERSION": "9.9.9"}, "no lock for vLLM 9.9.9"),
        ({"VLLM_VERSION": "0.33.0; touch pwned"}, "is not a version"),
        ({"COMMENT": "yes"}, "comment must be true or false"),
        ({"CACHE_DAYS": "a month"}, "cache-days must be a whole number of days"),
        ({"CACHE_DAYS": "-1"}, "cache-days must be a whole number of days"),
        ({"CACHE_MAX_MB": "1 GB"}, "cache-max-mb must be a whole number of megabytes"),
        ({"BASE": ""}, "input base is empty"),
        ({"VLLM_SRC": "missing"}, "is not a folder"),
        ({"VLLM_SRC": "plain"}, "is not a git checkout"),
    ],
)
def test_a_bad_input_stops_the_action_with_an_error_naming_it(
    tmp_path: Path, upstream: tuple[Path, list[str]], inputs: dict[str, str], message: str
) -> None:
    repo, shas = upstream
    clone(repo, tmp_path / "vllm")
    (tmp_path / "plain").mkdir()
    code, values, log = configure(tmp_path, **{"BASE": shas[0], "VLLM_SRC": "vllm", **inputs})
    assert code == 1
    assert "::error title=fence-audit::" in log
    assert message in log
    assert values == {}
    assert not (tmp_path / "pwned").exists()


def test_the_weekly_run_locks_and_audits_the_releases_newer_than_its_locks() -> None:
    """The schedule asks the index for releases newer than the newest lock, locks each
    before the list of releases is made (so the matrix holds it), hands the locks to
    every job that installs a release, and fails loudly on a lock it cannot write."""
    jobs = load(WORKFLOW)["jobs"]
    steps = jobs["releases"]["steps"]
    names = [s.get("id") or s.get("name") or s.get("uses") for s in steps]
    watch = next(s for s in steps if s.get("id") == "watch")
    assert "schedule" in watch["if"]
    assert "releases.py --newer" in watch["run"]
    lock = next(s for s in steps if s.get("id") == "lock")
    assert "nox -s lock --" in lock["run"]
    assert "::error" in lock["run"]
    assert names.index("watch") < names.index("lock") < names.index("list")
    upload = next(s for s in steps if "upload-artifact" in s.get("uses", ""))
    assert upload["with"]["name"] == "fence-audit-new-locks"
    for name in ("costs", "audit", "merge"):
        job_steps = jobs[name]["steps"]
        download = next(
            i
            for i, s in enumerate(job_steps)
            if s.get("with", {}).get("name") == "fence-audit-new-locks"
        )
        setup = next(i for i, s in enumerate(job_steps) if "setup-python" in s.get("uses", ""))
        assert download < setup, name  # the lock is there before pip's cache is keyed on it
    page = jobs["releases-page"]["steps"]
    assert any("needs.releases.outputs.unlocked" in s.get("if", "") for s in page)
