"""Judging mutants with the fork engine: the cache first, then the warm test process.

Every mutant that no cached verdict covers becomes a job (:mod:`audit.judging.jobs`); the
jobs go to the test process (:mod:`audit.testproc`), which proves with the
forced-fail check that mutants switch on, then judges each in a fork and leaves
one verdict file per mutant in the cache (:mod:`audit.judging.verdict_cache`). Here the
process's events drive the progress bar; what they end with decides whether the
verdicts can be trusted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from audit.baseline.cache import inherited_environment
from audit.core.errors import ExecutorFailed, ForcedFailCheckFailed
from audit.core.progress import ProgressBar
from audit.core.protocol import (
    Command,
    Done,
    ForcedFailChecked,
    Job,
    Judged,
    MissingTests,
    MutantStatus,
    MutationSpec,
    Warmed,
    parse_event,
    write_spec,
)
from audit.judging.jobs import ExecutorOptions, build_job, chains, forced_failure
from audit.judging.verdict_cache import TestHasher, VerdictCache
from audit.setup.config import Config
from audit.setup.model import Mutant, MutantResult, Target
from audit.setup.session import WarmSession, pytest_args, spawn
from audit.setup.suite import Suite


def judge(
    config: Config,
    suite: Suite,
    target: Target,
    mutants: Iterable[Mutant],
    function_hashes: Mapping[str, str],
    durations: Mapping[str, float],
    vllm_version: str,
    options: ExecutorOptions,
    warm: WarmSession | None = None,
    env: Mapping[str, Mapping[str, str]] | None = None,
    whole_failure: bool = False,
    log: str = "mutants.log",
) -> dict[str, MutantResult]:
    """A verdict for every mutant: from the cache, or from the test process.

    ``warm`` is the baseline's test process, kept alive: judging in it saves a new
    process the import, the collection and the warm-up. Without it (or when it is
    gone) a new test process is started. ``warm`` is closed either way. ``env``: by
    mutant id, what its judging fork sets in its environment (a second look's
    Hypothesis profile); ``whole_failure``: keep a Hypothesis example whole (the deep
    look's, :mod:`audit.judging.deep`); ``log``: the judging's log, in the reports' logs folder.
    """
    cache = VerdictCache(
        config.cache_dir / "results", TestHasher(suite.root, suite.plugins), vllm_version
    )
    source = target.path.read_text(encoding="utf-8")
    # what the test processes inherit and a test can read (HYPOTHESIS_PROFILE, say):
    # a verdict reached under one value is not the verdict under another
    inherited = inherited_environment(os.environ)
    verdicts: dict[str, MutantResult] = {}
    jobs: list[Job] = []
    keyed: list[tuple[Mutant, str]] = []  # every mutant with a verdict to have, its key
    for mutant in mutants:
        if not mutant.covered_by:
            verdicts[mutant.id] = MutantResult(mutant.id, MutantStatus.NO_TESTS)
            continue
        function = f"{mutant.module}:{mutant.function}" if mutant.module else mutant.function
        overrides = (env or {}).get(mutant.id, {})
        key = cache.key(
            mutant,
            function_hashes[function],
            {**inherited, **overrides},
            given_order=options.keep_order,
        )
        keyed.append((mutant, key))
        cached = cache.lookup(mutant.id, key) if options.use_cache else None
        # A timeout is a verdict like the others: a test is judged hung on the CPU
        # time it used, or on using none while it waited (audit.testproc.judge), not
        # on how long a loaded machine took to run it.
        if cached is not None:
            verdicts[mutant.id] = cached
            continue
        cache.forget(key)
        job = build_job(mutant, key, source, durations, options)
        if overrides:
            job = dataclasses.replace(job, env=dict(overrides))
        jobs.append(job)
    failures: dict[str, str] = {}  # judgings that ended without a verdict, and why
    try:
        if jobs:
            spec = _mutation_spec(
                config, suite, target, source, jobs, cache.directory, options, whole_failure
            )
            if not options.keep_order:  # a chain's kills would reorder its next job's tests
                spec = dataclasses.replace(spec, chains=chains(keyed, {job.key for job in jobs}))
            _run(config, suite, spec, warm, failures, log)
        elif warm is not None:
            warm.close()
    except KeyboardInterrupt:
        # The verdicts written so far are whole (temp file + rename): they are this
        # run's results, incomplete, and the cache the next run resumes from.
        judged = {job.id: cache.load(job.id, job.key) for job in jobs if cache.has(job.key)}
        raise Interrupted({**verdicts, **judged}) from None
    for job in jobs:
        verdicts[job.id] = cache.load(job.id, job.key, failure=failures.get(job.id, ""))
    return verdicts


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) while judging; ``verdicts``: the mutants judged so far."""

    def __init__(self, verdicts: dict[str, MutantResult]) -> None:
        super().__init__("interrupted")
        self.verdicts = verdicts


def _mutation_spec(
    config: Config,
    suite: Suite,
    target: Target,
    source: str,
    jobs: list[Job],
    results_dir: Path,
    options: ExecutorOptions,
    whole_failure: bool,
) -> MutationSpec:
    work = config.reports_dir / ".work"
    # The forced-fail check prefers a mutant of the target, whose tests are known to reach it.
    reference = next((job for job in jobs if not job.module), jobs[0])
    return MutationSpec(
        overlay={target.module: str(target.path)} if suite.source.checkout else {},
        # Native tracebacks: pytest's own long format costs ~0.5 s per killed mutant.
        pytest_args=(*pytest_args(suite, work), "--tb=native"),
        warm_up=tuple(sorted({t for job in jobs for t in job.tests})),
        target_module=target.module,
        target_path=str(target.path),
        results_dir=str(results_dir),
        workers=options.jobs,
        max_hangs=options.max_hangs,
        jobs=tuple(jobs),
        forced_fail=forced_failure(source, reference),
        whole_failure=whole_failure,
    )


def _run(
    config: Config,
    suite: Suite,
    spec: MutationSpec,
    warm: WarmSession | None,
    failures: dict[str, str],
    log_name: str = "mutants.log",
) -> None:
    """Hand ``spec`` to the warm process (or a new one) and follow its events to the end."""
    log = config.reports_dir / "logs" / log_name
    log.parent.mkdir(parents=True, exist_ok=True)
    spec_file = config.reports_dir / ".work" / "executor-spec.json"
    write_spec(spec_file, spec)
    progress = ProgressBar(len(spec.jobs))
    checked: ForcedFailChecked | None = None
    missing: MissingTests | None = None
    with log.open("w") as out:
        if warm is not None and warm.process.poll() is None:
            warm.send(Command("mutate", str(spec_file)))
            process = warm.process
        else:
            process = spawn(config, suite, spec_file)
        assert process.stdout is not None
        try:
            for line in process.stdout:
                out.write(line)
                event = parse_event(line)
                if isinstance(event, Judged) and event.id != spec.forced_fail.id:
                    progress.update(event.status)
                    if event.failure:
                        failures[event.id] = event.failure
                elif isinstance(event, Warmed):
                    progress.start()
                elif isinstance(event, ForcedFailChecked):
                    checked = event
                elif isinstance(event, MissingTests):
                    missing = event
                elif isinstance(event, Done):
                    break
            if process.poll() is None:
                process.kill()  # only pytest's teardown was left
            returncode = process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            progress.close()
    if missing is not None:
        raise ExecutorFailed(
            f"{missing.count} covering tests were not collected by the executor",
            details={
                "first": missing.tests[0],
                "log": str(log),
                "next": "read the log; if the suite changed since the coverage map was "
                "made, run fence-audit coverage again",
            },
        )
    if checked is None:
        raise ExecutorFailed(
            f"the executor ended (exit {returncode}) before the forced-fail check",
            details={"log": str(log), "next": "read the log's last lines"},
        )
    if checked.verdict.status is not MutantStatus.KILLED:
        raise ForcedFailCheckFailed(
            "the forced-fail check failed: a mutant that raises at once was not killed",
            details={
                "function": spec.forced_fail.function,
                "verdict": checked.verdict.status.value,
                "log": str(log),
                "next": "mutants do not switch on; no survivor could be trusted",
            },
        )
