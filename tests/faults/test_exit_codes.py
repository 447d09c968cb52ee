"""The README's exit-code table is the code's: every ``ExitCode`` documented, every
documented code in the enum, each with its meaning, and each asserted by some test.

CI believes these numbers, so a code added on one side only, or one no test ever
produces, fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from audit.cli import main
from audit.core import environment
from audit.core.environment import InstalledVllm
from audit.core.errors import ExitCode, TargetModified

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(.*?)\s*\|\s*$")


def readme_exit_codes() -> dict[int, str]:
    """The table under README.md's "## Exit codes": code -> meaning."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    return {int(m[1]): m[2] for line in section.splitlines() if (m := ROW.match(line))}


def test_every_exit_code_is_documented_and_every_documented_code_exists() -> None:
    documented = readme_exit_codes()
    assert documented, "README.md has no exit-code table under '## Exit codes'"
    undocumented = sorted(code.value for code in ExitCode if code.value not in documented)
    unknown = sorted(set(documented) - {code.value for code in ExitCode})
    assert not undocumented, f"in ExitCode, not in README.md's table: {undocumented}"
    assert not unknown, f"in README.md's table, not in ExitCode: {unknown}"


def test_every_documented_code_says_what_it_means() -> None:
    for code, meaning in readme_exit_codes().items():
        assert meaning.strip("- "), f"README.md's exit {code} has no meaning"


def asserted_codes() -> dict[int, list[str]]:
    """Per exit code, the test files that assert it: ``ExitCode.NAME`` in a file that
    checks exit codes, or the number compared with a return code or exit code."""
    found: dict[int, list[str]] = {code.value: [] for code in ExitCode}
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if not re.search(r"\b(returncode|exit_code|code)\b", text):
            continue
        for code in ExitCode:
            by_name = re.search(rf"\bExitCode\.{code.name}\b", text)
            by_number = re.search(
                rf"\b(returncode|exit_code|code)\s*==\s*{code.value}\b"
                rf"|\bmain\([^)]*\)\s*==\s*{code.value}\b",
                text,
            )
            if by_name or by_number:
                found[code.value].append(str(path.relative_to(ROOT)))
    return found


def test_every_exit_code_is_asserted_by_some_test() -> None:
    untested = [code for code, files in asserted_codes().items() if not files]
    assert not untested, f"no test asserts exit codes {untested}"


# --- the rows no other test produces --------------------------------------------------


def test_an_installed_file_that_changed_is_exit_10(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "vllm" / "target.py"
    target.parent.mkdir()
    target.write_text("x = 1\n")
    monkeypatch.setattr(environment, "recorded_sha256", lambda module: "0" * 64)
    with pytest.raises(TargetModified) as info:
        environment.verify_untouched(InstalledVllm("9.9.9", tmp_path), "vllm.target")
    assert info.value.exit_code == ExitCode.TARGET_MODIFIED
    assert info.value.details["file"] == str(target)


def test_a_bug_in_fence_audit_is_exit_70_with_its_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(args: object) -> ExitCode:
        raise RuntimeError("a bug")

    monkeypatch.setattr("audit.cli.run", broken)
    code = main(["regions"])
    stderr = capsys.readouterr().err
    assert code == ExitCode.INTERNAL
    assert "Traceback" in stderr
    assert "RuntimeError: a bug" in stderr
    assert "fence-audit: internal error" in stderr.splitlines()[-1]


def test_output_whose_reader_is_gone_does_not_stop_the_command(tmp_path: Path) -> None:
    """`fence-audit ... | head -1`: the reader closes the pipe, and the command goes on
    to its end and its exit code; it used to stop with a traceback (issue 59)."""
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence-audit]\n")
    results = ROOT / "tests" / "unit" / "data" / "results.json"
    command = [sys.executable, "-m", "audit", "gate", "--config", str(config)]
    command += ["--results", str(results), "--fail-under", "10"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    assert child.stdout is not None
    assert child.stderr is not None
    child.stdout.close()  # before the command prints: its first line meets a closed pipe
    stderr = child.stderr.read().decode()
    code = child.wait(timeout=120)
    assert "Traceback" not in stderr, stderr
    assert "BrokenPipeError" not in stderr, stderr
    assert code == ExitCode.OK, stderr
