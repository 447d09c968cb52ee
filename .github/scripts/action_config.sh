#!/usr/bin/env bash
# The composite action's first step (action.yml): checks its inputs, makes sure the
# base commit is in the vLLM checkout, and writes the resolved values to $GITHUB_OUTPUT:
#   version    the vLLM release (and lean environment) to run the tests in
#   lock-hash  sha256 of that release's lock (pip's cache key)
#   src        the vLLM checkout, absolute (nox runs from fence-audit's own folder)
#   base       the base commit, as a sha
#   reports    the reports folder, absolute, under $RUNNER_TEMP
# Inputs, from the environment: BASE, VLLM_VERSION, VLLM_SRC, COMMENT, CACHE_DAYS,
# CACHE_MAX_MB, PY (Python 3.11), GITHUB_ACTION_PATH (fence-audit's folder).
set -euo pipefail

fail() {
  echo "::error title=fence-audit::$1"
  exit 1
}

case "${COMMENT:-true}" in
  true | false) ;;
  *) fail "input comment must be true or false, not '$COMMENT'" ;;
esac

if ! [[ "${CACHE_DAYS:-30}" =~ ^[0-9]+$ ]]; then
  fail "input cache-days must be a whole number of days, not '$CACHE_DAYS'"
fi
if ! [[ "${CACHE_MAX_MB:-1000}" =~ ^[0-9]+$ ]]; then
  fail "input cache-max-mb must be a whole number of megabytes, not '$CACHE_MAX_MB'"
fi

if [ -z "${BASE:-}" ]; then
  fail "input base is empty: outside a pull_request event, pass the commit to diff against"
fi

version=${VLLM_VERSION:-}
if [ -z "$version" ]; then
  version=$("$PY" -c 'import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["tool"]["fence-audit"]["vllm-version"])' \
    "$GITHUB_ACTION_PATH/pyproject.toml")
fi
if ! [[ "$version" =~ ^[0-9][0-9A-Za-z.+-]*$ ]]; then
  fail "input vllm-version '$version' is not a version"
fi
lock="$GITHUB_ACTION_PATH/locks/vllm-$version.txt"
if [ ! -f "$lock" ]; then
  known=""
  for file in "$GITHUB_ACTION_PATH"/locks/vllm-*.txt; do
    [ -f "$file" ] || continue
    name=${file##*/vllm-}
    known="$known ${name%.txt}"
  done
  fail "fence-audit has no lock for vLLM $version (locks/vllm-$version.txt); it has:${known:- none}"
fi

src=$(cd "${VLLM_SRC:-.}" 2>/dev/null && pwd -P) || fail "input vllm-src '$VLLM_SRC' is not a folder"
git -C "$src" rev-parse --git-dir > /dev/null 2>&1 ||
  fail "input vllm-src '$VLLM_SRC' is not a git checkout (actions/checkout it first)"

# The base commit: a shallow checkout (actions/checkout's default fetch-depth: 1) lacks
# it. fence-audit diffs the checkout against it (`git diff BASE`, no merge base), so
# the commit alone is enough: fetched here if missing. A ref only the remote has (a
# branch or tag name) is resolved through FETCH_HEAD.
if ! git -C "$src" cat-file -e "$BASE^{commit}" 2> /dev/null; then
  echo "fetching the base commit $BASE (the checkout does not have it)"
  git -C "$src" fetch --no-tags --depth=1 origin "$BASE" ||
    fail "cannot fetch the base commit $BASE into $VLLM_SRC"
  base=$(git -C "$src" rev-parse --verify "FETCH_HEAD^{commit}")
else
  base=$(git -C "$src" rev-parse --verify "$BASE^{commit}")
fi

reports="$RUNNER_TEMP/fence-audit-reports"
{
  echo "version=$version"
  echo "lock-hash=$(sha256sum "$lock" | cut -c1-16)"
  echo "src=$src"
  echo "base=$base"
  echo "reports=$reports"
} >> "$GITHUB_OUTPUT"
echo "fence-audit: vLLM $version, checkout $src, changes since $base, reports in $reports"
