"""The composite action's sticky comment (.github/scripts/sticky_comment.py), offline.

`gh` is replaced by a fake pull request that answers the three calls the script makes
(list the comments, POST one, PATCH one), so no test reaches the network.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).parents[2] / ".github" / "scripts" / "sticky_comment.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sticky_comment", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sticky = load_script()
MARKER = sticky.MARKER
REPO, PR = "someone/vllm", 7


class FakePullRequest:
    """The comments of one pull request, as `gh api` would serve and change them."""

    def __init__(self, *bodies: str, fail: str = "") -> None:
        self.comments = [{"id": 100 + i, "body": body} for i, body in enumerate(bodies)]
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, args: list[str], stdin: str | None) -> str:
        self.calls.append(args)
        if self.fail and self.fail in args:
            raise sticky.GhError(f"gh {args[1]} failed: HTTP 403")
        if "--paginate" in args:
            assert args[-1] == f"repos/{REPO}/issues/{PR}/comments?per_page=100"
            # what `--jq '.[] | {id, body}'` prints: one object a line
            return "".join(json.dumps({"id": c["id"], "body": c["body"]}) + "\n" for c in self)
        method, path = args[args.index("--method") + 1], args[args.index("--method") + 2]
        body = json.loads(stdin or "")["body"]
        if method == "POST":
            assert path == f"repos/{REPO}/issues/{PR}/comments"
            self.comments.append({"id": 100 + len(self.comments), "body": body})
        else:
            assert method == "PATCH"
            (comment,) = (c for c in self.comments if path.endswith(f"/comments/{c['id']}"))
            comment["body"] = body
        return ""

    def __iter__(self) -> Any:
        return iter(self.comments)

    def methods(self) -> list[str]:
        return [a[a.index("--method") + 1] for a in self.calls if "--method" in a]


def post(tmp_path: Path, gh: FakePullRequest, summary: str | None, *extra: str) -> int:
    path = tmp_path / "summary.md"
    if summary is not None:
        path.write_text(summary, encoding="utf-8")
    args = ["post", "--repo", REPO, "--pr", str(PR), "--summary", str(path), *extra]
    return int(sticky.main(args, gh=gh))


def survivor(index: int, lines: int = 40) -> str:
    diff = "".join(f"-    old_{index}_{n}()\n+    new_{index}_{n}()\n" for n in range(lines))
    return (
        f"<details>\n<summary><code>m{index}</code> survived</summary>\n\n"
        f"```diff\n{diff}```\n</details>\n\n"
    )


def test_a_pull_request_without_the_comment_gets_a_new_one() -> None:
    request = sticky.plan(REPO, PR, [{"id": 1, "body": "LGTM"}])
    assert request == sticky.Request("POST", f"repos/{REPO}/issues/{PR}/comments")


def test_the_comment_carrying_the_marker_is_patched() -> None:
    comments = [{"id": 1, "body": "LGTM"}, {"id": 2, "body": f"{MARKER}\n## old score"}]
    assert sticky.plan(REPO, PR, comments) == sticky.Request(
        "PATCH", f"repos/{REPO}/issues/comments/2"
    )


def test_a_comment_quoting_the_marker_is_not_taken_over() -> None:
    comments = [{"id": 3, "body": f"> as fence-audit said {MARKER}"}, {"id": 4, "body": None}]
    assert sticky.plan(REPO, PR, comments).method == "POST"


def test_of_two_marked_comments_the_oldest_is_kept() -> None:
    comments = [{"id": 5, "body": f"{MARKER}\nfirst"}, {"id": 9, "body": f"{MARKER}\nsecond"}]
    assert sticky.plan(REPO, PR, comments).path.endswith("/comments/5")


def test_two_runs_leave_one_comment_holding_the_latest_summary(tmp_path: Path) -> None:
    gh = FakePullRequest("a reviewer's comment")
    assert post(tmp_path, gh, "## fence-audit: 50.0% of fence mutants killed\n") == 0
    assert post(tmp_path, gh, "## fence-audit: 100.0% of fence mutants killed\n") == 0
    assert gh.methods() == ["POST", "PATCH"]
    ours = [c for c in gh.comments if c["body"].startswith(MARKER)]
    assert len(ours) == 1
    assert "100.0% of fence mutants killed" in ours[0]["body"]
    assert "50.0%" not in ours[0]["body"]
    assert gh.comments[0]["body"] == "a reviewer's comment"


def test_a_summary_within_the_limit_is_posted_whole(tmp_path: Path) -> None:
    summary = "## fence-audit: 75.0% of fence mutants killed\n\n" + survivor(1)
    gh = FakePullRequest()
    post(tmp_path, gh, summary, "--run-url", "https://example.invalid/runs/1")
    body = gh.comments[0]["body"]
    assert body.startswith(f"{MARKER}\n{summary.rstrip()}")
    assert "[this run](https://example.invalid/runs/1)" in body
    assert "cut here" not in body


def test_a_summary_over_the_limit_is_cut_between_blocks_with_a_note(tmp_path: Path) -> None:
    summary = "## fence-audit: 10.0% of fence mutants killed\n\n" + "".join(
        survivor(i) for i in range(60)
    )
    assert sticky.size(summary) > sticky.LIMIT
    gh = FakePullRequest()
    url = "https://example.invalid/artifacts/42"
    post(tmp_path, gh, summary, "--artifact-url", url)
    body = gh.comments[0]["body"]
    assert sticky.size(body) <= sticky.LIMIT
    assert body.startswith(f"{MARKER}\n## fence-audit: 10.0%")
    assert f"[`fence-audit-reports`]({url})" in body
    assert "The summary is cut here" in body
    # whole survivors only: every block and fence that opens also closes
    assert body.count("<details>") == body.count("</details>") > 0
    assert len(re.findall(r"^```", body, flags=re.MULTILINE)) % 2 == 0
    shown = body.count("<details>")
    assert survivor(shown - 1) in body
    assert "<code>m" + str(shown) + "</code>" not in body


def test_a_fence_left_open_by_the_cut_is_closed() -> None:
    text = "```diff\n" + "".join(f"+line {n}\n" for n in range(1000))
    cut = sticky.truncate(text, 2000)
    assert sticky.size(cut) <= 2000
    assert cut.endswith("```\n")
    assert cut.count("```") == 2


def test_the_limit_counts_bytes_of_multibyte_text(tmp_path: Path) -> None:
    summary = "## fence-audit\n\n" + "ñ → ✓ 🙂\n" * 9000
    assert len(summary) < sticky.LIMIT * 2 < sticky.size(summary)
    gh = FakePullRequest()
    post(tmp_path, gh, summary)
    body = gh.comments[0]["body"]
    assert sticky.size(body) <= sticky.LIMIT
    assert "The summary is cut here" in body


def test_no_summary_says_the_audit_failed_and_replaces_an_old_score(tmp_path: Path) -> None:
    gh = FakePullRequest(f"{MARKER}\n## fence-audit: 100.0% of fence mutants killed")
    assert post(tmp_path, gh, None, "--exit-code", "4") == 0
    (comment,) = gh.comments
    assert comment["body"].startswith(MARKER)
    assert "could not audit this pull request (exit 4)" in comment["body"]
    assert "100.0%" not in comment["body"]


def test_an_unexpected_exit_code_flags_the_summary_as_incomplete(tmp_path: Path) -> None:
    gh = FakePullRequest()
    post(tmp_path, gh, "## fence-audit: 90.0%\n", "--exit-code", "13")
    assert "exited with 13" in gh.comments[0]["body"]
    gh = FakePullRequest()
    post(tmp_path, gh, "## fence-audit: 90.0%\n", "--exit-code", "2")
    assert "exited with" not in gh.comments[0]["body"]


def test_a_refused_post_is_reported_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gh = FakePullRequest(fail="POST")
    assert post(tmp_path, gh, "## fence-audit\n") == 1
    assert "HTTP 403" in capsys.readouterr().err


def test_a_dry_run_sends_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gh = FakePullRequest()
    assert post(tmp_path, gh, "## fence-audit: 80.0%\n", "--dry-run") == 0
    assert gh.calls == []
    assert MARKER in capsys.readouterr().out


@pytest.mark.parametrize(("recorded", "printed"), [(97.5, "97.5"), (None, "")])
def test_score_prints_the_overall_score_of_audit_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], recorded: float | None, printed: str
) -> None:
    results = tmp_path / "audit.json"
    results.write_text(json.dumps({"score": {"killed": 39, "score": recorded}}))
    assert sticky.main(["score", str(results)]) == 0
    assert capsys.readouterr().out == printed + "\n"


def test_score_of_a_pull_request_run_is_the_changed_code_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "audit.json"
    since = {"ref": "origin/main", "commit": "0" * 40, "score": {"killed": 3, "score": 75.0}}
    results.write_text(json.dumps({"score": {"score": 100.0}, "since": since}))
    assert sticky.main(["score", str(results)]) == 0
    assert capsys.readouterr().out == "75.0\n"


def test_score_of_a_missing_audit_json_is_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sticky.main(["score", str(tmp_path / "audit.json")]) == 0
    assert capsys.readouterr().out == "\n"
