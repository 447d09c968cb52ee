"""Post fence-audit's summary on a pull request as one sticky comment.

Used by the composite action (action.yml); standard library only, so it runs on any
Python the runner has. The GitHub API is reached through `gh api` (GH_TOKEN in the
environment), so this script never handles the token itself.

    sticky_comment.py post --repo OWNER/REPO --pr N --summary FILE [--exit-code N]
                           [--run-url URL] [--artifact NAME] [--artifact-url URL]
                           [--dry-run]
    sticky_comment.py score AUDIT_JSON

`post` lists the pull request's comments and PATCHes the one whose body starts with
MARKER, or POSTs a new one when there is none: a pull request has at most one
fence-audit comment, updated on every push. A body above GitHub's limit is cut at a
line, before an unfinished <details> block, with a note pointing to the artifact.
`--dry-run` prints the request and the body instead of sending them (no network).

`score` prints the score an audit.json leads with (a percentage, "" when nothing was
judged): in pull-request mode the changed code's (``since.score``), else the overall.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = "<!-- fence-audit -->"
# GitHub refuses a comment body over 65,536 characters. Sizes are counted here in UTF-8
# bytes, never fewer than characters (or UTF-16 units) whatever GitHub counts.
LIMIT = 65536
FENCE = "```"

# Runs `gh` with these arguments and this standard input; returns its standard output.
Gh = Callable[[list[str], str | None], str]


class GhError(Exception):
    """A `gh api` call failed."""


@dataclass(frozen=True, slots=True)
class Request:
    """One call of the REST API: PATCH the sticky comment, or POST a new one."""

    method: str
    path: str


def size(text: str) -> int:
    return len(text.encode("utf-8"))


def find_sticky(comments: Iterable[Mapping[str, Any]], marker: str = MARKER) -> int | None:
    """The id of the oldest comment whose body starts with the marker, if any.

    Only a body that *starts* with the marker counts, so a reviewer quoting or pasting
    fence-audit's comment does not take it over; the oldest one wins should two exist.
    """
    for comment in comments:  # the API lists them oldest first
        if str(comment.get("body") or "").lstrip().startswith(marker):
            return int(comment["id"])
    return None


def plan(repo: str, pr: int, comments: Iterable[Mapping[str, Any]]) -> Request:
    existing = find_sticky(comments)
    if existing is None:
        return Request("POST", f"repos/{repo}/issues/{pr}/comments")
    return Request("PATCH", f"repos/{repo}/issues/comments/{existing}")


def _open_details_start(lines: list[str]) -> int | None:
    """Index of the line opening the last <details> block left unclosed, if any."""
    opened: list[int] = []
    for index, line in enumerate(lines):
        if "<details" in line:
            opened.append(index)
        if "</details>" in line and opened:
            opened.pop()
    return opened[0] if opened else None


def truncate(text: str, budget: int) -> str:
    """The longest run of whole lines of ``text`` within ``budget`` bytes, blocks whole.

    A <details> block cut short is left out entirely, and a code fence left open is
    closed, so the part shown renders as it would in the whole summary.
    """
    if size(text) <= budget:
        return text
    room = budget - size(f"\n{FENCE}\n</details>\n")  # space to close what is open
    kept: list[str] = []
    used = 0
    for line in text.splitlines(keepends=True):
        if used + size(line) > room:
            break
        kept.append(line)
        used += size(line)
    start = _open_details_start(kept)
    if start:  # drop the unfinished block (unless it is all there is)
        kept = kept[:start]
    shown = "".join(kept).rstrip("\n")
    if sum(1 for line in kept if line.lstrip().startswith(FENCE)) % 2:
        shown += f"\n{FENCE}"
    if start == 0:
        shown += "\n</details>"
    return shown + "\n"


def render(
    summary: str | None,
    *,
    exit_code: int,
    run_url: str = "",
    artifact: str = "fence-audit-reports",
    artifact_url: str = "",
    limit: int = LIMIT,
) -> str:
    """The comment's body: the marker, the summary (cut to fit), a footer."""
    run = f"[this run]({run_url})" if run_url else "this run"
    where = f"[`{artifact}`]({artifact_url})" if artifact_url else f"`{artifact}`"
    footer = f"\n---\n<sub>fence-audit · reports: artifact {where} of {run}</sub>\n"
    if summary is None:
        text = (
            f"## fence-audit could not audit this pull request (exit {exit_code})\n\n"
            f"No summary was written: see the log of {run}.\n"
        )
    elif exit_code not in (0, 2, 3):
        text = (
            f"> [!WARNING]\n> fence-audit exited with {exit_code}: the summary below may be "
            f"incomplete; see the log of {run}.\n\n{summary}"
        )
    else:
        text = summary
    head = f"{MARKER}\n"
    if size(head + text.rstrip("\n") + "\n" + footer) <= limit:
        return head + text.rstrip("\n") + "\n" + footer
    note = (
        f"\n> [!NOTE]\n> The summary is cut here: at {size(text):,} bytes it is over the "
        f"{limit:,} characters GitHub takes in a comment. The whole `summary.md` and the "
        f"HTML report are in the artifact {where} of {run}.\n"
    )
    budget = limit - size(head) - size(note) - size(footer)
    return head + truncate(text, budget) + note + footer


def score(audit_json: Path) -> str:
    """The score an audit.json leads with, as fence-audit rounds it ("" if none).

    A pull-request run (``--since``) records the changed code's score under ``since``
    (every mutant on changed lines, those outside the fence regions included); a run
    of the whole fence, the overall score.
    """
    document = json.loads(audit_json.read_text(encoding="utf-8"))
    tally = (document.get("since") or document).get("score") or {}
    value = tally.get("score")
    return "" if value is None else str(value)


def run_gh(args: list[str], stdin: str | None) -> str:
    try:
        done = subprocess.run(
            ["gh", *args], input=stdin, capture_output=True, text=True, check=False
        )
    except FileNotFoundError as exc:
        raise GhError("the GitHub CLI (gh) is not installed on this runner") from exc
    if done.returncode != 0:
        raise GhError(f"gh {' '.join(args[:3])} failed: {done.stderr.strip()}")
    return done.stdout


def list_comments(gh: Gh, repo: str, pr: int) -> list[dict[str, Any]]:
    # --jq: one compact object per line, whatever the number of pages.
    out = gh(
        [
            "api",
            "--paginate",
            "--jq",
            ".[] | {id: .id, body: .body}",
            f"repos/{repo}/issues/{pr}/comments?per_page=100",
        ],
        None,
    )
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def post(gh: Gh, repo: str, pr: int, body: str) -> Request:
    request = plan(repo, pr, list_comments(gh, repo, pr))
    gh(
        ["api", "--method", request.method, request.path, "--input", "-", "--silent"],
        json.dumps({"body": body}),
    )
    return request


def main(argv: list[str] | None = None, gh: Gh = run_gh) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("post", help="create or update the sticky comment")
    p.add_argument("--repo", required=True, help="OWNER/REPO")
    p.add_argument("--pr", required=True, type=int, help="pull request number")
    p.add_argument("--summary", required=True, type=Path, help="summary.md (may be missing)")
    p.add_argument("--exit-code", type=int, default=0, help="the audit's exit code")
    p.add_argument("--run-url", default="")
    p.add_argument("--artifact", default="fence-audit-reports")
    p.add_argument("--artifact-url", default="")
    p.add_argument("--dry-run", action="store_true", help="print instead of sending")
    s = commands.add_parser("score", help="print the score recorded in an audit.json")
    s.add_argument("audit_json", type=Path)
    args = parser.parse_args(argv)

    if args.command == "score":
        print(score(args.audit_json) if args.audit_json.is_file() else "")
        return 0
    summary = args.summary.read_text(encoding="utf-8") if args.summary.is_file() else None
    body = render(
        summary,
        exit_code=args.exit_code,
        run_url=args.run_url,
        artifact=args.artifact,
        artifact_url=args.artifact_url,
    )
    if args.dry_run:
        print(f"would send to repos/{args.repo}/issues/{args.pr} ({size(body)} bytes):\n{body}")
        return 0
    try:
        request = post(gh, args.repo, args.pr, body)
    except GhError as exc:
        print(f"sticky_comment: {exc}", file=sys.stderr)
        return 1
    verb = "updated" if request.method == "PATCH" else "posted"
    print(f"sticky_comment: {verb} the fence-audit comment on #{args.pr} ({request.path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
