"""The benchmark: this executor against mutmut, fresh processes, and the floor.

On one in-region mutant set, in one run, it times
  (a) this executor (a warm process, one fork per mutant),
  (b) ``mutmut run`` on the same mutants, staged as a plain mutmut user would,
  (c) a sample of mutants each judged in a fresh pytest process,
  (d) the floor: one vLLM import, plus for each mutant the baseline duration of the
      tests it truly needs (its killer if killed, every covering test if not),
      divided by the workers,
and writes ``reports/bench.json``. Timing claims in this project come from here.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit import executor, mutmut_adapter
from audit.files import write_json
from audit.hermetic import child_environment, prepare_hf_home
from audit.jobs import ExecutorOptions
from audit.model import Mutant, MutantResult
from audit.mutants import build_mutants
from audit.outputs import claim
from audit.pipeline import CoverageStage
from audit.protocol import MutantStatus, PlainRunSpec, apply_edits, write_spec
from audit.session import WarmSession, pytest_args

BENCH_FORMAT = 1


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

    def ratios(self) -> dict[str, float]:
        return {
            "mutmut_over_ours": round(self.mutmut_s / self.ours_s, 2),
            "mutmut_over_ours_cold": round(self.mutmut_s / self.ours_cold_s, 2),
            "ours_over_floor": round(self.ours_s / self.floor_s, 2),
            "subprocess_over_ours": round(
                self.subprocess_s_per_mutant * self.mutants / self.ours_s, 2
            ),
        }


def run_bench(
    stage: CoverageStage, options: ExecutorOptions, only: tuple[str, ...], sample: int
) -> Bench:
    prepared = stage.prepared
    work = prepared.config.reports_dir / ".work" / "bench"
    # A private cache: the benchmark judges every mutant and leaves the real cache alone.
    config = dataclasses.replace(prepared.config, cache_dir=work / "cache")
    regions = tuple(r for r in prepared.regions if not only or r.name in only)
    source = prepared.target.path.read_text()

    started = time.monotonic()
    mutant_set = build_mutants(source, str(prepared.target.path), regions, stage.coverage_map.lines)
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

    started = time.monotonic()
    theirs = mutmut_adapter.judge(config, stage.suite, prepared.target, mutants, options.jobs)
    mutmut_s = time.monotonic() - started

    import_s = _vllm_import_seconds(config.cache_dir, config.offline_models, prepared.target.module)
    needed = sum(_needed_seconds(m, ours[m.id], stage.coverage_map.durations) for m in mutants)
    floor_s = import_s + needed / max(options.jobs, 1)

    picked = mutants[:: max(1, len(mutants) // max(sample, 1))][:sample]
    per_mutant = [_fresh_process_seconds(stage, config.cache_dir, m, source) for m in picked]

    disagreements = tuple(
        (m.id, ours[m.id].status.value, theirs[m.id].status.value)
        for m in mutants
        if ours[m.id].status is not theirs[m.id].status
        or cold[m.id].status is not ours[m.id].status
    )
    return Bench(
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
    )


def write_bench(bench: Bench, path: Path) -> dict[str, Any]:
    document = {
        "format": BENCH_FORMAT,
        **{k: v for k, v in dataclasses.asdict(bench).items() if k != "disagreements"},
        "disagreements": [
            {"id": i, "ours": ours, "mutmut": theirs} for i, ours, theirs in bench.disagreements
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
            f"mutants judged            {bench.mutants} (workers: {bench.jobs})",
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
            + "".join(f"\n  {i}: ours {a}, mutmut {b}" for i, a, b in bench.disagreements),
            f"(not timed above: mutant generation {bench.generation_s:.1f} s, "
            f"baseline under coverage {bench.baseline_s:.1f} s)",
        ]
    )


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
