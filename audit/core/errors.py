"""The audit's errors: one base class, one subclass per outcome CI cares about.

Only the CLI catches these. Each carries the exit code the README documents, a
summary, and the details a person needs to act: on which input, where to look, and
what to do next. It prints as one line (:meth:`AuditError.render`), so a CI log's
last line or a grep for ``fence-audit:`` shows all of it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes; the table in README.md mirrors this enum."""

    OK = 0
    USAGE = 1  # bad command line or configuration
    SCORE_BELOW_THRESHOLD = 2  # the gate (mutation stage)
    TIMEOUTS_ONLY = 3  # the gate (mutation stage)
    BASELINE_FAILED = 4  # a test failed before any mutant was applied
    NO_TESTS_SELECTED = 5  # the suite selection collected no test
    REGION_UNRESOLVED = 6  # a region names code the audited source lacks
    ENVIRONMENT = 7  # installed vLLM missing or not the configured version
    SOURCE_UNAVAILABLE = 8  # vLLM's tests not in the cache and the index unreachable
    SOURCE_INTEGRITY = 9  # a download does not match the index's sha256
    TARGET_MODIFIED = 10  # the installed vLLM file changed during the run
    FORCED_FAIL_CHECK = 11  # a mutant that raises at once was not killed: mutants are inert
    CATALOGUE_STALE = 12  # `catalogue check`: an entry no longer applies to the source
    INCOMPLETE = 13  # the gate: the results are of an interrupted run
    HUNT_FOUND = 14  # `nox -s hunt`: the machine raised; hunt.md holds the shrunk program
    PATCH_DOES_NOT_APPLY = 15  # `nox -s upstream`: a fix no longer applies to the release
    UPSTREAM_CHECK_FAILED = 16  # `nox -s upstream`: a check of the patch series failed
    WORSE_THAN_STANDING = 17  # `gate --standing`: the run is worse than its release's standing
    CANNOT_WRITE = 18  # a file or folder fence-audit writes could not be written (disk full, ...)
    INTERNAL = 70  # a bug in fence-audit
    INTERRUPTED = 130  # Ctrl-C or SIGTERM: the results so far are written, marked incomplete


class AuditError(Exception):
    """Base of every error the CLI reports; never raised directly."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, summary: str, *, details: dict[str, str] | None = None) -> None:
        super().__init__(summary)
        self.summary = summary
        self.details: dict[str, str] = dict(details or {})

    def render(self) -> str:
        """One line: what failed, then where (the details, in parentheses), then what to
        do (``next``). A detail that spans lines (a traceback's tail) is joined."""
        where = "; ".join(f"{k}: {_one_line(v)}" for k, v in self.details.items() if k != "next")
        line = f"fence-audit: {_one_line(self.summary)}" + (f" ({where})" if where else "")
        if "next" in self.details:
            line += f"; next: {_one_line(self.details['next'])}"
        return line


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


class ConfigError(AuditError):
    exit_code = ExitCode.USAGE


class BaselineFailed(AuditError):
    exit_code = ExitCode.BASELINE_FAILED


class NoTestsSelected(AuditError):
    exit_code = ExitCode.NO_TESTS_SELECTED


class RegionUnresolved(AuditError):
    exit_code = ExitCode.REGION_UNRESOLVED


class EnvironmentMismatch(AuditError):
    exit_code = ExitCode.ENVIRONMENT


class SourceUnavailable(AuditError):
    exit_code = ExitCode.SOURCE_UNAVAILABLE


class SourceIntegrityError(AuditError):
    exit_code = ExitCode.SOURCE_INTEGRITY


class TargetModified(AuditError):
    exit_code = ExitCode.TARGET_MODIFIED


class ForcedFailCheckFailed(AuditError):
    exit_code = ExitCode.FORCED_FAIL_CHECK


class ResultsIncomplete(AuditError):
    """The gate was given the results of an interrupted run: it cannot pass on them."""

    exit_code = ExitCode.INCOMPLETE


class PatchDoesNotApply(AuditError):
    """A patch of the upstream series does not apply to the release's files."""

    exit_code = ExitCode.PATCH_DOES_NOT_APPLY


class UpstreamCheckFailed(AuditError):
    """A check of the upstream series failed (a test, the patched audit, the hunt)."""

    exit_code = ExitCode.UPSTREAM_CHECK_FAILED


class CannotWrite(AuditError):
    """A file or folder fence-audit writes could not be written: no space left on its
    device, not writable, or a folder where a file goes. What was judged is cached."""

    exit_code = ExitCode.CANNOT_WRITE


class ExecutorFailed(AuditError):
    """The test process could not judge the mutants (it died, or lost tests)."""

    exit_code = ExitCode.INTERNAL


class RunInterrupted(AuditError):
    """Ctrl-C (or SIGTERM) during a run; the verdicts so far are kept."""

    exit_code = ExitCode.INTERRUPTED


def invalid_file(summary: str, where: str, next_step: str, **more: str) -> ConfigError:
    """A file the project writes for the audit (a catalogue entry, the equivalents or the
    findings file) that cannot be read as one: ``where`` names the file (and the table in
    it), ``more`` any other detail, ``next_step`` what to change there."""
    return ConfigError(summary, details={"file": where, **more, "next": next_step})
