"""The audit's stages, in order. This is the one place that lists them.

    config -> source (vLLM package + its tests) -> regions -> baseline under coverage
           -> [mutants -> execute -> results -> reports -> gate: later stages]

Each stage is a plain function of another module; this module only wires them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from audit import coverage_map, environment, sources
from audit.baseline import run_baseline, stage_suite
from audit.config import Config, SuitePath
from audit.environment import Fingerprint
from audit.model import BaselineRun, RegionCoverage, Target
from audit.regions import Region, resolve_regions
from audit.sources import TestSource


@dataclass(frozen=True, slots=True)
class Prepared:
    """Everything known before a test runs: nothing of it writes a report."""

    config: Config
    vllm: environment.InstalledVllm
    source: TestSource
    target: Target
    regions: tuple[Region, ...]
    before: Fingerprint


@dataclass(frozen=True, slots=True)
class CoverageStage:
    prepared: Prepared
    run: BaselineRun
    regions: tuple[RegionCoverage, ...]
    after: Fingerprint


def prepare(config: Config, *, vllm_src: Path | None = None) -> Prepared:
    vllm = environment.installed_vllm(config.vllm_version)
    before = environment.verify_untouched(vllm, config.target)
    if vllm_src is not None:
        source = sources.checkout_source(vllm_src, config.target)
    else:
        source = sources.sdist_tests(
            vllm.version, index_url=config.index_url, cache_dir=config.cache_dir
        )
    path = source.target_file(config.target) or before.path
    text = path.read_text(encoding="utf-8")
    target = Target(
        module=config.target,
        path=path,
        installed_path=before.path,
        sha256=environment.sha256_file(path),
    )
    regions = resolve_regions(text, config.regions, filename=str(path))
    return Prepared(config, vllm, source, target, regions, before)


def coverage(prepared: Prepared, suite_entries: tuple[SuitePath, ...] = ()) -> CoverageStage:
    config = prepared.config
    work = config.reports_dir / ".work"
    suite = stage_suite(config, prepared.source, suite_entries or config.suite, work)
    run = run_baseline(config, suite, prepared.target, work)
    after = environment.verify_untouched(prepared.vllm, config.target)
    cmap = coverage_map.build_coverage_map(run, prepared.vllm.version)
    regions = coverage_map.region_coverage(run, prepared.regions)
    coverage_map.write_html(run, config.reports_dir / "coverage")
    coverage_map.write_coverage_map(cmap, config.reports_dir / "coverage-map.json")
    coverage_map.write_regions(regions, run, config.reports_dir / "regions.json")
    return CoverageStage(prepared, run, regions, after)
