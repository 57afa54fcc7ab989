#!/usr/bin/env bash
# The one test command: setup (idempotent, skipped if not root), ruff, mypy --strict, lint-imports (the
# layer contract in pyproject.toml), pytest.
# Every stage runs; the exit status is non-zero if any of them failed (pytest's 5, "no tests
# collected", counts as a failure like any other).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
VENV=$PWD/.venv
export PATH="$VENV/bin:$PATH"  # tools installed in the venv (hadolint, shellcheck) are found by tests

log() { printf '\n==> %s\n' "$*" >&2; }

if [ "$(id -u)" -eq 0 ]; then
  log "scripts/setup.sh"
  scripts/setup.sh || { echo "scripts/test.sh: setup failed" >&2; exit 1; }
elif [ -x "$VENV/bin/pytest" ]; then
  log "not root: skipping scripts/setup.sh (tests that need root will skip)"
else
  echo "scripts/test.sh: no venv at $VENV; run as root (sudo scripts/test.sh) to set it up" >&2
  exit 1
fi

failed=()

log "ruff check"
"$VENV/bin/ruff" check . || failed+=(ruff)

log "mypy --strict warren"
"$VENV/bin/mypy" --strict warren || failed+=(mypy)

log "lint-imports (layers: pyproject.toml [tool.importlinter])"
"$VENV/bin/lint-imports" --no-cache || failed+=(lint-imports)

log "pytest"
"$VENV/bin/pytest" -p no:cacheprovider tests "$@" || failed+=(pytest)

if [ "${#failed[@]}" -gt 0 ]; then
  echo "scripts/test.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "scripts/test.sh: all checks passed" >&2
