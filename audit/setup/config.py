"""Configuration: built-in defaults, overridden by ``[tool.fence-audit]``.

The defaults live in ``audit/data/defaults.toml`` in the same schema a project
writes, so there is one parser and one place to read what the audit does when
nothing is configured. Every key is checked: an unknown key or a wrong type is a
:class:`ConfigError` that names the key and the file.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import urllib.parse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from audit.core.errors import ConfigError
from audit.core.inputs import known_keys, read_toml, resolved
from audit.setup.region_specs import RegionSpec, parse_regions
from audit.setup.values import expect, release_version, string, strings

DEFAULT_CACHE_ENV = "FENCE_AUDIT_CACHE"
INDEX_URL_ENV = "FENCE_AUDIT_INDEX_URL"
VLLM_VERSION_ENV = "FENCE_AUDIT_VLLM_VERSION"  # the noxfile installs this one too

SuiteRoot = Literal["vllm", "project"]


@dataclass(frozen=True, slots=True)
class SuitePath:
    """One entry of the fence suite: a path under vLLM's tests or this project."""

    root: SuiteRoot
    path: str
    optional: bool = False

    def __str__(self) -> str:
        return f"{self.root}:{self.path}{'?' if self.optional else ''}"


@dataclass(frozen=True, slots=True)
class DeepLook:
    """The deep second look at survivors (``mutate --deep``, :mod:`audit.judging.deep`): the
    random workloads under this Hypothesis profile, for this many CPU seconds each."""

    profile: str = "deep"
    seconds: float = 300.0


DEFAULT_DEEP_SECONDS = DeepLook().seconds
DEEP_SECONDS_MOST = 86_400 * 365  # a year: more is a typo, and 10**400 overflows a float


@dataclass(frozen=True, slots=True)
class GateThresholds:
    """What the gate requires, each a percentage in 0-100 (0: not checked)."""

    fail_under: float = 0.0  # overall score
    regions: tuple[tuple[str, float], ...] = ()  # per-region score
    min_line_coverage: float = 0.0  # of each region's lines, by the baseline


@dataclass(frozen=True, slots=True)
class Config:
    source: str  # where the configuration was read, for error messages
    project_dir: Path
    vllm_version: str
    target: str  # dotted module name of the audited module
    reports_dir: Path
    cache_dir: Path
    index_url: str
    suite: tuple[SuitePath, ...]
    offline_models: tuple[str, ...]
    regions: tuple[RegionSpec, ...]
    gate: GateThresholds = GateThresholds()
    catalogue_dir: Path | None = None  # hand-written mutants, one TOML file each
    equivalents_file: Path | None = None  # reviewed equivalent mutants, with reasons
    findings_file: Path | None = None  # real vLLM bugs: the tests they fail, the releases
    plugins: tuple[SuitePath, ...] = ()  # pytest plugin files loaded into every test run
    # the suite's random workloads, by test id or file: what `mutate --random-alone`
    # judges every fence mutant with alone (audit.judging.alone)
    random_workloads: tuple[SuitePath, ...] = ()
    random_profile: str = ""  # the Hypothesis profile they run under alone ("": theirs)
    deep: DeepLook = DeepLook()  # the deep second look at survivors (mutate --deep)
    cache_dir_from: str = "the default"  # who chose cache_dir, for error messages
    vllm_version_from: str = "[tool.fence-audit] vllm-version"  # who chose it, likewise

    def region(self, name: str) -> RegionSpec:
        for region in self.regions:
            if region.name == name:
                return region
        raise ConfigError(
            f"no region named {name!r}",
            details={
                "known": ", ".join(r.name for r in self.regions),
                "config": self.source,
                "next": "name a known region, or configure it under [tool.fence-audit.regions]",
            },
        )


_TOP_KEYS = {
    "vllm-version",
    "target",
    "reports",
    "cache-dir",
    "index-url",
    "suite",
    "regions",
    "gate",
    "catalogue",
    "equivalents",
    "findings",
    "deep",
}
_SUITE_KEYS = {"paths", "offline-models", "plugins", "random-workloads", "random-profile"}
_GATE_KEYS = {"fail-under", "regions", "min-line-coverage"}
_DEEP_KEYS = {"profile", "seconds"}
_TABLES = {"suite": _SUITE_KEYS, "gate": _GATE_KEYS, "deep": _DEEP_KEYS}  # merged key by key


def default_table() -> dict[str, Any]:
    text = resources.files("audit").joinpath("data/defaults.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def default_cache_dir() -> Path:
    """``$FENCE_AUDIT_CACHE``, else ``$XDG_CACHE_HOME/fence-audit``, else ``~/.cache/...``."""
    return _default_cache_dir()[0]


def _default_cache_dir() -> tuple[Path, str]:
    """The default cache folder, and which variable chose it. A variable set to the
    empty string counts as unset, as the XDG base directory specification has it."""
    if env := os.environ.get(DEFAULT_CACHE_ENV):
        return Path(env), f"${DEFAULT_CACHE_ENV}"
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "fence-audit", "$XDG_CACHE_HOME"
    return Path.home() / ".cache" / "fence-audit", "the default, ~/.cache/fence-audit"


def config_from_arguments(args: Any) -> Config:
    """The configuration a command line asks for: ``--config`` (else ./pyproject.toml,
    if there is one) under the options every command shares (``--reports``, and where
    the command has them ``--cache-dir`` and ``--plugin``)."""
    pyproject = args.config
    if pyproject is None and Path("pyproject.toml").is_file():
        pyproject = Path("pyproject.toml")
    config = load_config(
        resolved(pyproject, "--config") if pyproject else None,
        table_required=args.config is not None,
    )
    if args.reports:
        config = dataclasses.replace(config, reports_dir=resolved(args.reports, "--reports"))
    if getattr(args, "cache_dir", None):
        cache = resolved(args.cache_dir, "--cache-dir")
        config = dataclasses.replace(config, cache_dir=cache, cache_dir_from="--cache-dir")
    if getattr(args, "plugin", None):
        plugins = tuple(parse_suite_path(p) for p in args.plugin)
        config = dataclasses.replace(config, plugins=plugins)
    return config


def load_config(
    pyproject: Path | None = None,
    *,
    project_dir: Path | None = None,
    table_required: bool = False,
) -> Config:
    """Read ``[tool.fence-audit]`` from ``pyproject`` (if any) over the defaults.

    ``table_required``: the file was named (``--config``), so a file without the table
    is a mistake (a typo such as ``[tool.fence_audit]``), not a project using the
    defaults; the file found as ./pyproject.toml may have none."""
    table = default_table()
    source = "built-in defaults"
    user: dict[str, Any] = {}
    if pyproject is not None:
        source = str(pyproject)
        data = read_toml(pyproject, "configuration file")
        tool = expect(data.get("tool", {}), dict, "[tool]", source)
        if table_required and "fence-audit" not in tool:
            near = sorted(k for k in tool if k.replace("_", "-").lower() == "fence-audit")
            raise ConfigError(
                f"{pyproject} has no [tool.fence-audit] table"
                + (f" ([tool.{near[0]}] is not it)" if near else ""),
                details={
                    "config": source,
                    "next": "name the table [tool.fence-audit], or drop --config to use "
                    "the defaults",
                },
            )
        user = expect(tool.get("fence-audit", {}), dict, "[tool.fence-audit]", source)
        table = merge_tables(table, user, source)
        project_dir = project_dir or pyproject.parent
    config = parse_config(table, source=source, project_dir=project_dir or Path.cwd())
    _check_configured_paths(config, user)
    return config


def _check_configured_paths(config: Config, user: dict[str, Any]) -> None:
    """A path the project configures must exist; only a built-in default may be absent
    (a project without a catalogue or equivalents need not say so)."""
    for key, path, kind in (
        ("catalogue", config.catalogue_dir, "folder"),
        ("equivalents", config.equivalents_file, "file"),
        ("findings", config.findings_file, "file"),
    ):
        if key not in user or path is None:
            continue
        found = path.is_dir() if kind == "folder" else path.is_file()
        if not found:
            state = "is not a " + kind if path.exists() else "does not exist"
            raise ConfigError(
                f"the {key} {kind} {path} {state}",
                details={
                    "config": f"{config.source}: {key} = {user[key]!r}",
                    "next": f"fix the path, or remove the key if the project has no {key}",
                },
            )


def merge_tables(base: dict[str, Any], user: dict[str, Any], source: str) -> dict[str, Any]:
    known_keys(user, _TOP_KEYS, "[tool.fence-audit]", config=source)
    merged = dict(base)
    for key, value in user.items():
        if key in _TABLES:
            where = f"[tool.fence-audit.{key}]"
            expect(value, dict, where, source)
            known_keys(value, _TABLES[key], where, config=source)
            merged[key] = {**base.get(key, {}), **value}
        else:  # "regions" included: a user's regions replace the defaults whole
            merged[key] = value
    return merged


def parse_config(table: dict[str, Any], *, source: str, project_dir: Path) -> Config:
    known_keys(table, _TOP_KEYS, "[tool.fence-audit]", config=source)
    suite_table = table.get("suite", {})
    expect(suite_table, dict, "suite", source)
    known_keys(suite_table, _SUITE_KEYS, "suite", config=source)

    reports = Path(string(table, "reports", source))
    cache = table.get("cache-dir")
    if cache:
        cache_dir, cache_from = (
            Path(expect(cache, str, "cache-dir", source)),
            f"cache-dir in {source}",
        )
    else:
        cache_dir, cache_from = _default_cache_dir()
    if os.environ.get(VLLM_VERSION_ENV):
        version, version_from = os.environ[VLLM_VERSION_ENV], f"${VLLM_VERSION_ENV}"
    else:
        version = string(table, "vllm-version", source)
        version_from = f"[tool.fence-audit] vllm-version in {source}"
    return Config(
        source=source,
        project_dir=project_dir,
        vllm_version=release_version(version, version_from),
        vllm_version_from=version_from,
        target=string(table, "target", source),
        reports_dir=reports if reports.is_absolute() else project_dir / reports,
        cache_dir=cache_dir,
        cache_dir_from=cache_from,
        index_url=_index_url(table, source),
        suite=tuple(
            parse_suite_path(p, source) for p in strings(suite_table, "paths", source, "suite")
        ),
        offline_models=strings(suite_table, "offline-models", source, "suite"),
        plugins=tuple(
            parse_suite_path(p, source) for p in strings(suite_table, "plugins", source, "suite")
        ),
        random_workloads=tuple(
            parse_suite_path(p, source)
            for p in strings(suite_table, "random-workloads", source, "suite")
        ),
        random_profile=expect(
            suite_table.get("random-profile", ""), str, "suite.random-profile", source
        ),
        regions=parse_regions(table.get("regions", {}), source),
        gate=parse_gate(table.get("gate", {}), source),
        catalogue_dir=_path(table.get("catalogue"), "catalogue", source, project_dir),
        equivalents_file=_path(table.get("equivalents"), "equivalents", source, project_dir),
        findings_file=_path(table.get("findings"), "findings", source, project_dir),
        deep=parse_deep(table.get("deep", {}), source),
    )


def _index_url(table: dict[str, Any], source: str) -> str:
    """``$FENCE_AUDIT_INDEX_URL``, else ``index-url``: an http(s) URL, checked here so a
    typo is a usage error before anything runs, not a failed download."""
    url, origin = os.environ.get(INDEX_URL_ENV, ""), f"${INDEX_URL_ENV}"
    if not url:
        url, origin = string(table, "index-url", source), f"index-url in {source}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. "http://[::1": an unclosed IPv6 address
        parts = urllib.parse.SplitResult("", "", "", "", "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"the package index URL {url!r} is not an http(s) URL",
            details={
                "set by": origin,
                "next": "give the URL of a PEP 691 simple index, such as https://pypi.org/simple",
            },
        )
    return url


def _path(value: Any, key: str, source: str, project_dir: Path) -> Path | None:
    if value is None:
        return None
    path = Path(expect(value, str, key, source))
    return path if path.is_absolute() else project_dir / path


def parse_deep(table: Any, source: str) -> DeepLook:
    expect(table, dict, "deep", source)
    known_keys(table, _DEEP_KEYS, "deep", config=source)
    seconds = table.get("seconds", DEFAULT_DEEP_SECONDS)
    number = not isinstance(seconds, bool) and isinstance(seconds, int | float)
    if not number or not 0 < seconds <= DEEP_SECONDS_MOST:  # NaN, inf and 10**400 too
        huge = number and isinstance(seconds, int) and seconds > DEEP_SECONDS_MOST
        shown = f"a number of {len(str(seconds))} digits" if huge else None
        raise ConfigError(
            f"deep.seconds must be a number of seconds above 0 and at most "
            f"{DEEP_SECONDS_MOST:,}, not {shown or repr(seconds)}",
            details={"config": source, "next": "e.g. deep = { seconds = 300 }"},
        )
    profile = string(table, "profile", source, "deep") if "profile" in table else "deep"
    return DeepLook(profile=profile, seconds=float(seconds))


def parse_gate(table: Any, source: str) -> GateThresholds:
    expect(table, dict, "gate", source)
    known_keys(table, _GATE_KEYS, "gate", config=source)
    regions = expect(table.get("regions", {}), dict, "gate.regions", source)
    return GateThresholds(
        fail_under=percentage(table.get("fail-under", 0), "gate.fail-under", source),
        regions=tuple(
            (str(name), percentage(value, f"gate.regions.{name}", source))
            for name, value in regions.items()
        ),
        min_line_coverage=percentage(
            table.get("min-line-coverage", 0), "gate.min-line-coverage", source
        ),
    )


def percentage(value: Any, where: str, source: str) -> float:
    """A threshold: a number from 0 to 100 (100 means exactly 100)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"{where} must be a number from 0 to 100, not {value!r}",
            details={
                "config": source,
                "next": f"write {where} as a percentage such as 90, unquoted",
            },
        )
    if not 0 <= value <= 100:
        raise ConfigError(
            f"{where} is {value}: a threshold lies between 0 and 100",
            details={"config": source, "next": "give a percentage such as 90"},
        )
    return float(value)


def parse_suite_path(text: str, source: str = "command line") -> SuitePath:
    root, sep, path = text.partition(":")
    if not sep or root not in ("vllm", "project") or not path:
        raise ConfigError(
            f"suite path {text!r} is not of the form 'vllm:PATH' or 'project:PATH'",
            details={
                "config": source,
                "next": "prefix the path with vllm: (inside vLLM's tests) or project: (this repo)",
            },
        )
    file = PurePosixPath(path.partition("::")[0])
    if file.is_absolute() or ".." in file.parts:
        inside = "vLLM's source tree" if root == "vllm" else "this project"
        raise ConfigError(
            f"suite path {text!r} leaves {inside}: a suite path is relative and stays inside",
            details={"config": source, "next": f"give a path under {inside}, without '..'"},
        )
    optional = path.endswith("?")
    return SuitePath(root=root, path=path.rstrip("?"), optional=optional)  # type: ignore[arg-type]
