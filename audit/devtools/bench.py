"""The benchmark: this executor against mutmut, fresh processes, and the floor.

On one mutant set (the regions', or with ``--scope file`` the whole module's), in
one run, it times
  (a) this executor (a warm process, one fork per mutant),
  (b) ``mutmut run`` on the same mutants, staged as a plain mutmut user would,
  (c) a sample of mutants each judged in a fresh pytest process,
  (d) the floor: one vLLM import, plus for each mutant the baseline duration of the
      tests it truly needs (its killer if killed, every covering test if not),
      divided by the workers,
  (e) what a user waits for: ``fence-audit mutate`` end to end in a new process, from
      caches holding nothing but vLLM's tests and vLLM's own home (generation,
      baseline, mutants, reports), then the same command again with nothing changed
      (the no-op),
and writes ``reports/bench.json``. Timing claims in this project come from here.

Two comparisons of statuses. ``statuses_agree``: ours as the audit judges (its own
order of tests, going on past a hung test) against mutmut's run. Where a mutant
fails one test and hangs another, the two can differ by which test each met first.
``statuses_agree_in_mutmut_order``: every mutant judged again by ours, in a new
process, given the tests mutmut's run gave it, in mutmut's order, stopping where
mutmut stops (the first test that fails or hangs): the same question asked of both
engines, so a difference there is one of judging, not of order.

Where the first comparison differs on a mutant, it asks why, three ways: mutmut's own
runner given our killing test alone (does mutmut kill it too?), ours in mutmut's order
(does ours then say what mutmut said?), and mutmut again, on that mutant alone (does
mutmut say it twice?).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.core.files import write_json
from audit.core.hermetic import child_environment, prepare_hf_home
from audit.core.outputs import claim
from audit.core.protocol import MutantStatus, PlainRunSpec, apply_edits, write_spec
from audit.judging import executor
from audit.judging.jobs import ExecutorOptions
from audit.mutation import mutmut_adapter, run_mutants
from audit.pipeline import CoverageStage
from audit.setup.config import Config
from audit.setup.model import Mutant, MutantResult
from audit.setup.session import WarmSession, pytest_args

BENCH_FORMAT = 1
IN_MUTMUT_ORDER_LOG = "mutants-in-mutmut-order.log"  # ours_in_order's judging


@dataclass(frozen=True, slots=True)
class Bench:
    mutants: int
    jobs: int
    generation_s: float
    baseline_s: float
    ours_s: float  # judging in the baseline's warm process, as the audit does
    ours_cold_s: float  # the same in a new process: import, collection, warm-up included
    mutmut_s: float
    floor_s: float
    vllm_import_s: float
    subprocess_s_per_mutant: float
    subprocess_sample: int
    statuses_agree: bool
    disagreements: tuple[tuple[str, str, str], ...]  # (mutant id, ours, mutmut)
    scope: str = "regions"
    # `fence-audit mutate` from cold caches, in a new process: the mean of its runs
    ours_e2e_s: float = 0.0
    # each run's seconds: one before mutmut's run, one after it (the machine drifts)
    ours_e2e_runs_s: tuple[float, ...] = ()
    noop_s: float = 0.0  # the same command again, nothing changed
    # disagreements where ours killed the mutant after some of its tests hung and
    # mutmut, which stops its run at the first hang, says timeout: the policy after a
    # hang differs, not the code run (DESIGN.md, "The process boundary")
    killed_after_hangs: tuple[str, ...] = ()
    # of the disagreements where ours killed the mutant and mutmut did not (after hung
    # tests or not: ours may run its killer first, mutmut a test that hangs first),
    # those mutmut's own runner kills when it runs only the test that killed it in ours
    confirmed_by_mutmut: tuple[str, ...] = ()
    # each disagreement judged again by ours, its tests in the order mutmut's run gave
    # them and stopping at the first that fails or hangs, as mutmut does: the status
    # ours then says (mutmut's too: the disagreement is the order and the policy after
    # a hang, not the tests' outcomes), or "" when mutmut's stats gave it no test
    in_mutmut_order: tuple[tuple[str, str], ...] = ()
    # each disagreement judged by mutmut again, in a run of its own (its tests timed
    # and ordered afresh): the status mutmut's second run says
    mutmut_again: tuple[tuple[str, str], ...] = ()
    # every mutant judged by ours in a new process in mutmut's order and stopping as
    # mutmut stops (ours_in_order): its seconds, and (mutant id, ours so, mutmut) where
    # the statuses differ ("" for ours: mutmut's stats gave the mutant no test)
    in_order_s: float = 0.0
    in_order_disagreements: tuple[tuple[str, str, str], ...] = ()

    @property
    def statuses_agree_in_mutmut_order(self) -> bool:
        """Given mutmut's tests, in mutmut's order, stopping where mutmut stops, ours
        says mutmut's status of every mutant (False when that run was not made)."""
        return bool(self.in_order_s) and not self.in_order_disagreements

    @property
    def disagreements_confirmed(self) -> bool:
        """Every disagreement is one mutmut itself confirms (:attr:`confirmed_by_mutmut`)."""
        return set(self.confirmed_by_mutmut) >= {i for i, _, _ in self.disagreements}

    @property
    def reproduced_in_mutmut_order(self) -> tuple[str, ...]:
        """The disagreements where ours, given mutmut's order and policy, says mutmut's
        status."""
        theirs = {i: b for i, _, b in self.disagreements}
        return tuple(i for i, status in self.in_mutmut_order if status == theirs.get(i))

    def ratios(self) -> dict[str, float]:
        ratios: dict[str, float] = {}
        if self.ours_e2e_s:
            ratios["mutmut_over_ours_e2e"] = round(self.mutmut_s / self.ours_e2e_s, 2)
            ratios["noop_over_ours_e2e"] = round(self.noop_s / self.ours_e2e_s, 3)
        if self.in_order_s:
            ratios["mutmut_over_ours_in_order"] = round(self.mutmut_s / self.in_order_s, 2)
        return {
            **ratios,
            "mutmut_over_ours": round(self.mutmut_s / self.ours_s, 2),
            "mutmut_over_ours_cold": round(self.mutmut_s / self.ours_cold_s, 2),
            "ours_over_floor": round(self.ours_s / self.floor_s, 2),
            "subprocess_over_ours": round(
                self.subprocess_s_per_mutant * self.mutants / self.ours_s, 2
            ),
        }


def run_bench(
    stage: CoverageStage,
    options: ExecutorOptions,
    only: tuple[str, ...],
    sample: int,
    command: tuple[str, ...] = (),
) -> Bench:
    """``command``: the `fence-audit mutate` options that select the same mutants and
    suite, for the end-to-end timings (none: they are skipped)."""
    prepared = stage.prepared
    work = prepared.config.reports_dir / ".work" / "bench"
    # The judging logs, listed as fence-audit's before they are written (a later run
    # refuses a reports folder holding files it did not write).
    claim(
        prepared.config.reports_dir,
        "logs/mutants.log",
        "logs/mutmut.log",
        f"logs/{IN_MUTMUT_ORDER_LOG}",
    )
    # A private cache: the benchmark judges every mutant and leaves the real cache alone.
    config = dataclasses.replace(prepared.config, cache_dir=work / "cache")
    shutil.rmtree(config.cache_dir / "mutations", ignore_errors=True)  # generation cold
    regions = run_mutants.run_regions(prepared, only)
    source = prepared.target.path.read_text()

    started = time.monotonic()
    mutant_set = run_mutants.mutmut_mutants(
        dataclasses.replace(prepared, config=config), regions, source, stage.coverage_map.lines
    )
    generation_s = time.monotonic() - started
    mutants = [m for m in mutant_set.mutants if m.covered_by]
    fresh = dataclasses.replace(options, use_cache=False)

    def judge(warm: WarmSession | None) -> tuple[dict[str, MutantResult], float]:
        started = time.monotonic()
        verdicts = executor.judge(
            config,
            stage.suite,
            prepared.target,
            mutants,
            mutant_set.function_hashes,
            stage.coverage_map.durations,
            prepared.vllm.version,
            fresh,
            warm,
        )
        return verdicts, time.monotonic() - started

    # As the audit runs: in the baseline's process, already warm.
    ours, ours_s = judge(stage.warm)
    # In a new process: import, collection and warm-up included.
    cold, ours_cold_s = judge(None)

    # The cold end-to-end command runs on both sides of mutmut's run, and the figure is
    # their mean: this machine drifts by tens of percent within minutes, and a ratio of
    # two runs minutes apart would carry the drift.
    first = end_to_end(stage, command, work / "e2e", again=False) if command else None
    started = time.monotonic()
    theirs = mutmut_adapter.judge(config, stage.suite, prepared.target, mutants, options.jobs)
    mutmut_s = time.monotonic() - started
    # Read now: each confirmation below stages mutmut's project again.
    orders = mutmut_adapter.run_orders(
        mutmut_adapter.project_dir(config),
        prepared.target.module,
        mutants,
        stage.coverage_map.durations,
    )

    import_s = _vllm_import_seconds(config.cache_dir, config.offline_models, prepared.target.module)
    needed = sum(_needed_seconds(m, ours[m.id], stage.coverage_map.durations) for m in mutants)
    floor_s = import_s + needed / max(options.jobs, 1)

    picked = mutants[:: max(1, len(mutants) // max(sample, 1))][:sample]
    per_mutant = [_fresh_process_seconds(stage, config.cache_dir, m, source) for m in picked]

    second = end_to_end(stage, command, work / "e2e") if command else None
    e2e_runs = tuple(run[0] for run in (first, second) if run is not None)
    noop_s = second[1] if second is not None else 0.0
    e2e_statuses = [run[2] for run in (first, second) if run is not None]
    disagreements = tuple(
        (m.id, ours[m.id].status.value, theirs[m.id].status.value)
        for m in mutants
        if ours[m.id].status is not theirs[m.id].status
        or cold[m.id].status is not ours[m.id].status
        or any(e2e.get(m.id) != ours[m.id].status.value for e2e in e2e_statuses)
    )
    killed_after_hangs = tuple(
        i
        for i, mine, theirs_status in disagreements
        if mine == MutantStatus.KILLED.value
        and ours[i].hung
        and theirs_status == MutantStatus.TIMEOUT.value
    )
    by_id = {m.id: m for m in mutants}
    killed_by_ours_alone = [
        i
        for i, mine, theirs_status in disagreements
        if mine == MutantStatus.KILLED.value and theirs_status != MutantStatus.KILLED.value
    ]
    confirmed = tuple(
        i
        for n, i in enumerate(killed_by_ours_alone, start=1)
        if cold[i].status is ours[i].status
        and all(e2e.get(i) == ours[i].status.value for e2e in e2e_statuses)
        and mutmut_kills_alone(
            stage, config, by_id[i], ours[i].killed_by, f"mutmut-confirm-{n}.log"
        )
    )
    replayed = [by_id[i] for i, _, _ in disagreements]
    # Every mutant judged again by ours in mutmut's order, stopping where mutmut stops:
    # the same tests, order and policy after a failure or a hang on both sides, so a
    # status that differs here is one the two engines' judging differs on.
    started = time.monotonic()
    again = ours_in_order(stage, config, options, mutants, orders, mutant_set.function_hashes)
    in_order_s = time.monotonic() - started
    order_disagreements = tuple(
        (m.id, again.get(m.id, ""), theirs[m.id].status.value)
        for m in mutants
        if again.get(m.id) != theirs[m.id].status.value
    )
    twice = tuple(
        (m.id, mutmut_alone(stage, config, m, f"mutmut-again-{n}.log"))
        for n, m in enumerate(replayed, start=1)
    )
    return Bench(
        killed_after_hangs=killed_after_hangs,
        confirmed_by_mutmut=confirmed,
        in_mutmut_order=tuple((m.id, again.get(m.id, "")) for m in replayed),
        in_order_s=round(in_order_s, 3),
        in_order_disagreements=order_disagreements,
        mutmut_again=twice,
        mutants=len(mutants),
        jobs=options.jobs,
        generation_s=round(generation_s, 3),
        baseline_s=round(stage.run.duration_s, 3),
        ours_s=round(ours_s, 3),
        ours_cold_s=round(ours_cold_s, 3),
        mutmut_s=round(mutmut_s, 3),
        floor_s=round(floor_s, 3),
        vllm_import_s=round(import_s, 3),
        subprocess_s_per_mutant=round(sum(per_mutant) / max(len(per_mutant), 1), 3),
        subprocess_sample=len(per_mutant),
        statuses_agree=not disagreements,
        disagreements=disagreements,
        scope=prepared.scope,
        ours_e2e_s=round(sum(e2e_runs) / len(e2e_runs), 3) if e2e_runs else 0.0,
        ours_e2e_runs_s=tuple(round(s, 3) for s in e2e_runs),
        noop_s=round(noop_s, 3),
    )


def mutmut_kills_alone(
    stage: CoverageStage, config: Config, mutant: Mutant, test: str, log: str
) -> bool:
    """Whether mutmut's own runner kills ``mutant`` when it selects ``test`` alone (the
    test that killed it in ours): mutmut then confirms the kill itself, and the
    disagreement lies in which tests ran before it (a hang stops mutmut's run)."""
    return mutmut_alone(stage, config, mutant, log, tests=(test,)) == MutantStatus.KILLED.value


def mutmut_alone(
    stage: CoverageStage, config: Config, mutant: Mutant, log: str, tests: tuple[str, ...] = ()
) -> str:
    """mutmut's status of ``mutant`` from a run of mutmut's own that judges it alone,
    its tests selected and timed afresh (``tests``: only these selected) and logged in
    the reports' ``logs/LOG``: whether mutmut says of it twice what it said once."""
    claim(config.reports_dir, f"logs/{log}")
    verdicts = mutmut_adapter.judge(
        config, stage.suite, stage.prepared.target, [mutant], 1, tests=tests, log=log
    )
    return verdicts[mutant.id].status.value


def ours_in_order(
    stage: CoverageStage,
    config: Config,
    options: ExecutorOptions,
    mutants: list[Mutant],
    orders: Mapping[str, tuple[str, ...]],
    function_hashes: Mapping[str, str],
) -> dict[str, str]:
    """Each of ``mutants`` judged by ours, in a new process, with its tests as
    ``orders`` gives them (mutmut's), stopping at the first test that fails (killed)
    or hangs (timeout), as mutmut's run does: its status, by mutant id. A mutant
    ``orders`` gives no test for is left out."""
    replayed = [
        dataclasses.replace(m, covered_by=orders[m.id]) for m in mutants if orders.get(m.id)
    ]
    if not replayed:
        return {}
    policy = dataclasses.replace(options, keep_order=True, max_hangs=1, use_cache=False)
    verdicts = executor.judge(
        config,
        stage.suite,
        stage.prepared.target,
        replayed,
        function_hashes,
        stage.coverage_map.durations,
        stage.prepared.vllm.version,
        policy,
        log=IN_MUTMUT_ORDER_LOG,
    )
    return {i: verdict.status.value for i, verdict in verdicts.items()}


def mutate_command(args: argparse.Namespace) -> tuple[str, ...]:
    """The `fence-audit mutate` options that judge what this benchmark judges: the same
    scope, regions, suite, workers and checkout, and mutmut's mutants only."""
    command = ["--scope", args.scope, "--no-catalogue", "--jobs", str(args.jobs)]
    for region in args.region:
        command += ["--region", region]
    for entry in args.suite:
        command += ["--suite", entry]
    if args.vllm_src is not None:
        command += ["--vllm-src", str(args.vllm_src)]
    return tuple(command)


def end_to_end(
    stage: CoverageStage, command: tuple[str, ...], work: Path, *, again: bool = True
) -> tuple[float, float, dict[str, str]]:
    """`fence-audit mutate COMMAND` in a new process from a cache holding only vLLM's
    tests and vLLM's own home, timed; then (``again``) once more, nothing changed.
    Returns both wall times (0 for a run not made) and each mutant's status.

    vLLM's home (``vllm-home``: where vLLM keeps what it learnt by inspecting a model
    class in a subprocess, 10-15 s the first time on this machine) is copied as it is:
    mutmut's run in this benchmark has it, as has every audit after the first one on a
    machine. fence-audit's own caches (verdicts, baselines, mutations) start empty."""
    prepared = stage.prepared
    shutil.rmtree(work, ignore_errors=True)
    cache, reports = work / "cache", work / "reports"
    tests = prepared.source.root
    if not prepared.source.checkout:  # vLLM's extracted tests: no download in the timing
        shutil.copytree(tests, cache / "tests" / tests.name, symlinks=True)
        digest = prepared.config.cache_dir / "sdist" / f"{tests.name}.tar.gz.sha256"
        if digest.is_file():
            (cache / "sdist").mkdir(parents=True)
            shutil.copy(digest, cache / "sdist" / digest.name)
    home = prepared.config.cache_dir / "vllm-home"
    if home.is_dir():
        shutil.copytree(home, cache / "vllm-home", symlinks=True)
    argv = [
        sys.executable, "-m", "audit", "mutate", *command,
        "--cache-dir", str(cache), "--reports", str(reports),
    ]  # fmt: skip
    if Path(prepared.config.source).is_file():  # the configuration this run read
        argv += ["--config", prepared.config.source]
    times = [0.0, 0.0]
    for run in range(2 if again else 1):
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        times[run] = time.monotonic() - started
        if done.returncode not in (0, 2):  # 2: the gate failed, the audit ran
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise RuntimeError(f"the end-to-end run exited {done.returncode}: {tail}")
    document = json.loads((reports / "audit.json").read_text())
    # A reviewed equivalent is a survivor the audit explains; the judging saw a survivor.
    judged = {"equivalent": MutantStatus.SURVIVED.value}
    statuses = {m["id"]: judged.get(m["status"], m["status"]) for m in document["mutants"]}
    return times[0], times[1], statuses


def write_bench(bench: Bench, path: Path) -> dict[str, Any]:
    document = {
        "format": BENCH_FORMAT,
        **{
            k: v
            for k, v in dataclasses.asdict(bench).items()
            if k
            not in ("disagreements", "in_mutmut_order", "mutmut_again", "in_order_disagreements")
        },
        "in_mutmut_order": dict(bench.in_mutmut_order),
        "mutmut_again": dict(bench.mutmut_again),
        "disagreements_confirmed": bench.disagreements_confirmed,
        "reproduced_in_mutmut_order": list(bench.reproduced_in_mutmut_order),
        "disagreements": [
            {"id": i, "ours": ours, "mutmut": theirs} for i, ours, theirs in bench.disagreements
        ],
        "statuses_agree_in_mutmut_order": bench.statuses_agree_in_mutmut_order,
        "in_order_disagreements": [
            {"id": i, "ours_in_mutmut_order": ours, "mutmut": theirs}
            for i, ours, theirs in bench.in_order_disagreements
        ],
        "ratios": bench.ratios(),
    }
    claim(path.parent, path.name)
    write_json(path, document)
    return document


def format_bench(bench: Bench) -> str:
    ratios = bench.ratios()
    return "\n".join(
        [
            f"mutants judged            {bench.mutants} (scope: {bench.scope}; workers: "
            f"{bench.jobs})",
            f"this executor             {bench.ours_s:8.1f} s   "
            "(in the baseline's warm process, as the audit runs it)",
            f"  in a new process        {bench.ours_cold_s:8.1f} s   "
            f"mutmut / that = {ratios['mutmut_over_ours_cold']}",
            f"mutmut run                {bench.mutmut_s:8.1f} s   "
            f"mutmut / ours = {ratios['mutmut_over_ours']}",
            f"floor                     {bench.floor_s:8.1f} s   "
            f"ours / floor = {ratios['ours_over_floor']}",
            f"fresh process per mutant  {bench.subprocess_s_per_mutant:8.1f} s each "
            f"(sample of {bench.subprocess_sample}); all of them / ours = "
            f"{ratios['subprocess_over_ours']}",
            f"statuses agree            {bench.statuses_agree}"
            + "".join(
                f"\n  {i}: ours {a}, mutmut {b}" + _why(bench, i) for i, a, b in bench.disagreements
            )
            + (
                "\n  every disagreement confirmed by mutmut itself"
                if bench.disagreements and bench.disagreements_confirmed
                else ""
            )
            + (
                "\n  every disagreement reproduced by ours in mutmut's order"
                if bench.disagreements
                and len(bench.reproduced_in_mutmut_order) == len(bench.disagreements)
                else ""
            ),
            *(
                [
                    f"ours in mutmut's order    {bench.in_order_s:8.1f} s   "
                    f"mutmut / that = {ratios['mutmut_over_ours_in_order']}   (a new process; "
                    "each mutant's tests as mutmut ran them, stopping where mutmut stops)",
                    f"  statuses agree so       {bench.statuses_agree_in_mutmut_order}"
                    + "".join(
                        f"\n  {i}: ours in that order "
                        + (a or "not judged (mutmut's stats give it no test)")
                        + f", mutmut {b}"
                        for i, a, b in bench.in_order_disagreements
                    ),
                ]
                if bench.in_order_s
                else []
            ),
            f"(not timed above: mutant generation {bench.generation_s:.1f} s, "
            f"baseline under coverage {bench.baseline_s:.1f} s)",
            *(
                [
                    f"end to end, cold caches   {bench.ours_e2e_s:8.1f} s   "
                    f"mutmut / that = {ratios['mutmut_over_ours_e2e']}   "
                    "(`fence-audit mutate` in a new process: generation, baseline, mutants, "
                    "reports; the mean of "
                    + " s before mutmut's run and ".join(f"{s:.1f}" for s in bench.ours_e2e_runs_s)
                    + " s after)",
                    f"again, nothing changed    {bench.noop_s:8.1f} s   "
                    f"that / end to end = {ratios['noop_over_ours_e2e']}",
                ]
                if bench.ours_e2e_s
                else []
            ),
        ]
    )


def _why(bench: Bench, mutant_id: str) -> str:
    """What the bench learnt of one disagreement, for its line."""
    said = []
    if mutant_id in bench.killed_after_hangs:
        said.append("ours after hung tests: mutmut stops at a hang")
    if mutant_id in bench.confirmed_by_mutmut:
        said.append("mutmut kills it running our killing test alone")
    replayed = dict(bench.in_mutmut_order).get(mutant_id)
    if replayed:
        said.append(f"ours says {replayed} in mutmut's order, stopping as mutmut stops")
    elif replayed is not None:
        said.append("mutmut's stats give it no test")
    theirs = next(b for i, _, b in bench.disagreements if i == mutant_id)
    second = dict(bench.mutmut_again).get(mutant_id)
    if second == theirs:
        said.append(f"mutmut says {second} again, alone")
    elif second:
        said.append(f"mutmut, run again alone, says {second}")
    return f" ({'; '.join(said)})" if said else ""


def _needed_seconds(mutant: Mutant, verdict: MutantResult, durations: Mapping[str, float]) -> float:
    if verdict.status is MutantStatus.KILLED:
        return durations.get(verdict.killed_by, 0.0)
    return sum(durations.get(t, 0.0) for t in mutant.covered_by)


def _vllm_import_seconds(cache_dir: Path, models: tuple[str, ...], module: str) -> float:
    env = child_environment(os.environ, prepare_hf_home(cache_dir, models))
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", f"import {module}, vllm.v1.core.sched.scheduler"],
        env=env,
        check=True,
        capture_output=True,
    )
    return time.monotonic() - started


def _fresh_process_seconds(
    stage: CoverageStage, cache_dir: Path, mutant: Mutant, source: str
) -> float:
    """Judge one mutant as subprocess-based tools do: a new pytest process, ``-x``."""
    target = stage.prepared.target
    work = stage.prepared.config.reports_dir / ".work"
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        mutated = Path(tmp) / "mutated.py"
        mutated.write_text(apply_edits(source, mutant.edits))
        spec = Path(tmp) / "spec.json"
        tests = sorted(
            mutant.covered_by, key=lambda t: (stage.coverage_map.durations.get(t, 0.0), t)
        )
        plain = PlainRunSpec(
            overlay={target.module: str(mutated)},
            select=tuple(tests),
            pytest_args=(*pytest_args(stage.suite, work), "-x", "--tb=native"),
        )
        write_spec(spec, plain)
        env = child_environment(
            os.environ, prepare_hf_home(cache_dir, stage.prepared.config.offline_models)
        )
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "audit.testproc", str(spec)],
            cwd=stage.suite.root,
            env=env,
            check=False,
            capture_output=True,
        )
        return time.monotonic() - started
