from __future__ import annotations

import re
from pathlib import Path

import pytest

from audit.core.errors import ConfigError, ExitCode
from audit.setup.config import load_config, parse_suite_path
from audit.setup.values import release_version


def write_pyproject(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(body)
    return path


def test_defaults_name_vllm_0_34_0_and_the_four_fence_regions() -> None:
    config = load_config()
    assert config.vllm_version == "0.34.0"
    assert [r.name for r in config.regions] == [
        "population",
        "flush",
        "removal",
        "sliding_window",
    ]
    assert config.target.endswith("offloading.scheduler")


def test_project_table_overrides_a_key_and_keeps_the_rest(tmp_path: Path) -> None:
    path = write_pyproject(tmp_path, '[tool.fence-audit]\nvllm-version = "0.33.0"\n')
    config = load_config(path)
    assert config.vllm_version == "0.33.0"
    assert len(config.regions) == 4
    assert config.reports_dir == tmp_path / "reports"


def test_suite_table_merges_key_by_key(tmp_path: Path) -> None:
    path = write_pyproject(tmp_path, '[tool.fence-audit.suite]\npaths = ["project:t"]\n')
    config = load_config(path)
    assert [str(p) for p in config.suite] == ["project:t"]
    assert config.offline_models == ("facebook/opt-125m",)


def test_user_regions_replace_the_defaults_whole(tmp_path: Path) -> None:
    path = write_pyproject(
        tmp_path,
        """
[tool.fence-audit.regions.only]
description = "d"
[[tool.fence-audit.regions.only.select]]
function = "f"
statements = ["x = 1", { match = "if y", part = "header", containing = "z" }]
""",
    )
    config = load_config(path)
    assert [r.name for r in config.regions] == ["only"]
    selectors = config.regions[0].selections[0].statements
    assert selectors[1].part == "header"
    assert selectors[1].containing == "z"


def test_alternatives_and_since_parse(tmp_path: Path) -> None:
    path = write_pyproject(
        tmp_path,
        """
[[tool.fence-audit.regions.r.select]]
function = ["C._meta", "C.meta"]
since = "0.29.0"
statements = [{ match = ["for a in b", "for c in d"], since = "0.30.0" }]
""",
    )
    (selection,) = load_config(path).regions[0].selections
    assert selection.names == ("C._meta", "C.meta")
    assert selection.since == "0.29.0"
    assert selection.statements[0].anchors == ("for a in b", "for c in d")
    assert selection.statements[0].since == "0.30.0"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('function = []\nsince = "0.29.0"', "must be a string or a list of strings"),
        ('function = ["f", 3]', "must be a string or a list of strings"),
        ('function = "f"\nsince = "soon"', "since must be a vLLM release"),
    ],
)
def test_bad_alternatives_or_since_are_usage_errors(
    tmp_path: Path, line: str, message: str
) -> None:
    path = write_pyproject(tmp_path, f"[[tool.fence-audit.regions.r.select]]\n{line}\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert info.value.exit_code == ExitCode.USAGE


def test_unknown_key_is_an_error_naming_key_and_file(tmp_path: Path) -> None:
    path = write_pyproject(tmp_path, '[tool.fence-audit]\nvllm_version = "0.33.0"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "vllm_version" in info.value.summary
    assert info.value.details["config"] == str(path)
    assert info.value.exit_code == ExitCode.USAGE


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    path = write_pyproject(tmp_path, "[tool.fence-audit\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_wrong_statement_part_is_rejected(tmp_path: Path) -> None:
    path = write_pyproject(
        tmp_path,
        """
[[tool.fence-audit.regions.r.select]]
function = "f"
statements = [{ match = "x", part = "body" }]
""",
    )
    with pytest.raises(ConfigError, match="part must be"):
        load_config(path)


def test_region_with_no_selection_is_rejected(tmp_path: Path) -> None:
    path = write_pyproject(tmp_path, '[tool.fence-audit.regions.r]\ndescription = "d"\n')
    with pytest.raises(ConfigError, match="selects nothing"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "root", "path", "optional"),
    [
        ("vllm:tests/a.py", "vllm", "tests/a.py", False),
        ("project:tests/fence?", "project", "tests/fence", True),
    ],
)
def test_suite_paths_parse(text: str, root: str, path: str, optional: bool) -> None:
    entry = parse_suite_path(text)
    assert (entry.root, entry.path, entry.optional) == (root, path, optional)
    assert str(entry) == text


@pytest.mark.parametrize("text", ["tests/a.py", "other:x", "vllm:"])
def test_suite_path_without_a_known_root_is_rejected(text: str) -> None:
    with pytest.raises(ConfigError, match="vllm:PATH"):
        parse_suite_path(text)


@pytest.mark.parametrize(
    ("text", "leaves"),
    [
        ("project:../../etc/passwd", "this project"),
        ("vllm:../../../etc/hostname", "vLLM's source tree"),
        ("vllm:tests/../../x.py::test_a", "vLLM's source tree"),
        ("project:/etc/passwd", "this project"),
    ],
)
def test_a_suite_path_that_leaves_its_root_is_refused(text: str, leaves: str) -> None:
    with pytest.raises(ConfigError, match=f"leaves {leaves}"):
        parse_suite_path(text)
    assert parse_suite_path("vllm:tests/a.py::test_b[../x]").path == "tests/a.py::test_b[../x]"


def test_index_url_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCE_AUDIT_INDEX_URL", "http://mirror.invalid/simple")
    assert load_config().index_url == "http://mirror.invalid/simple"


def test_vllm_version_from_the_environment_wins_as_in_the_noxfile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FENCE_AUDIT_VLLM_VERSION", "0.34.0")
    path = write_pyproject(tmp_path, '[tool.fence-audit]\nvllm-version = "0.33.0"\n')
    assert load_config(path).vllm_version == "0.34.0"


def test_cache_dir_defaults_to_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FENCE_AUDIT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_config().cache_dir == tmp_path / "fence-audit"


def test_an_empty_cache_variable_counts_as_unset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FENCE_AUDIT_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = load_config()
    assert config.cache_dir == tmp_path / "fence-audit"
    assert config.cache_dir_from == "$XDG_CACHE_HOME"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert load_config().cache_dir == Path.home() / ".cache" / "fence-audit"


def test_plugins_are_staged_loaded_by_name_and_must_be_python_files(tmp_path: Path) -> None:
    from audit.setup.session import pytest_args
    from audit.setup.sources import TestSource
    from audit.setup.suite import stage_suite

    project = tmp_path / "project"
    (project / "tests" / "fence").mkdir(parents=True)
    (project / "tests" / "fence" / "oracle_plugin.py").write_text("")
    (project / "tests" / "fence" / "notes.txt").write_text("")
    vllm_tests = tmp_path / "vllm"
    (vllm_tests / "tests").mkdir(parents=True)
    body = (
        '[tool.fence-audit.suite]\npaths = []\nplugins = ["project:tests/fence/oracle_plugin.py"]\n'
    )
    config = load_config(write_pyproject(project, body))
    source = TestSource(vllm_tests, "test folder")

    suite = stage_suite(config, source, (), tmp_path / "work")
    assert suite.plugins == (suite.root / "project" / "tests" / "fence" / "oracle_plugin.py",)
    assert "plugin project:tests/fence/oracle_plugin.py" in suite.selection
    args = pytest_args(suite, tmp_path / "work")
    assert args[args.index("-p", args.index("no:cacheprovider")) :][-2:] == ["-p", "oracle_plugin"]

    for bad in ("project:tests/fence/notes.txt", "project:tests/fence/missing.py"):
        body = f'[tool.fence-audit.suite]\npaths = []\nplugins = ["{bad}"]\n'
        config = load_config(write_pyproject(project, body))
        with pytest.raises(ConfigError) as error:
            stage_suite(config, source, (), tmp_path / "work")
        assert "is not a Python file" in error.value.render()


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0rc1", "0.10.1.post1", "1.0.0.dev3"])
def test_a_release_s_version_is_taken_as_given(version: str) -> None:
    assert release_version(version, "--release") == version


@pytest.mark.parametrize("version", ["", "garbage", "../../x", "0.33.0+cpu", "0.33.0; rm", " 0.33"])
def test_anything_else_is_refused_naming_where_it_came_from(version: str) -> None:
    with pytest.raises(ConfigError, match=r"^the vLLM version .* is not a release$") as info:
        release_version(version, "$FENCE_AUDIT_VLLM_VERSION")
    assert info.value.details["set by"] == "$FENCE_AUDIT_VLLM_VERSION"
    assert info.value.render().endswith("; next: give a release as PyPI lists it, such as 0.33.0")


def test_the_environment_s_version_is_checked_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_pyproject(tmp_path, '[tool.fence-audit]\nvllm-version = "0.34.0"\n')
    assert load_config(path).vllm_version_from.startswith("[tool.fence-audit] vllm-version in ")
    monkeypatch.setenv("FENCE_AUDIT_VLLM_VERSION", "0.32.0")
    config = load_config(path)
    assert (config.vllm_version, config.vllm_version_from) == (
        "0.32.0",
        "$FENCE_AUDIT_VLLM_VERSION",
    )
    monkeypatch.setenv("FENCE_AUDIT_VLLM_VERSION", "../0.32.0")
    with pytest.raises(ConfigError, match=r"the vLLM version '\.\./0\.32\.0' is not") as info:
        load_config(path)
    assert info.value.details["set by"] == "$FENCE_AUDIT_VLLM_VERSION"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("vllm-version = 0.33", "vllm-version must be a string, not a number: 0.33"),
        (
            "[tool.fence-audit.suite]\npaths = 'vllm:tests'",
            "suite.paths must be a list, not a",
        ),
        (
            "[tool.fence-audit.suite]\npaths = ['a', 3]",
            "each of suite.paths must be a string",
        ),
        (
            "[tool.fence-audit.suite]\nrandom-profile = 1",
            "suite.random-profile must be a string",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_names_its_key_and_how_to_write_it(
    tmp_path: Path, body: str, says: str
) -> None:
    path = write_pyproject(tmp_path, f"[tool.fence-audit]\n{body}\n")
    with pytest.raises(ConfigError, match=re.escape(says)) as info:
        load_config(path)
    assert info.value.details["next"].startswith("write ")


def test_the_noxfile_builds_environments_under_install_only() -> None:
    """`nox --install-only` skips session.run but not session.run_install; the lean
    environment and Chromium are built by the latter, or the stamp of an unbuilt
    environment would be written."""
    import ast

    tree = ast.parse((Path(__file__).parents[2] / "noxfile.py").read_text())
    builders = {"lean_env", "ensure_chromium"}
    calls = {
        (f.name, node.func.attr)
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and f.name in builders
        for node in ast.walk(f)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"run", "run_install"}
    }
    assert calls == {("lean_env", "run_install"), ("ensure_chromium", "run_install")}
