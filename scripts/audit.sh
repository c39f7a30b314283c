#!/usr/bin/env bash
# `make audit`: pip-audit of every lock file in requirements/ plus torch, against the advisories of PyPI's
# per-release JSON API. Each exception is an advisory id in requirements/audit-exceptions.txt with its reason.
# When that API is unreachable (no network, or a registry mirror without it) the audit cannot run: this says so
# and exits 0, or 1 with AUDIT_REQUIRED=1.
# Usage: scripts/audit.sh PIP_AUDIT TORCH_REQUIREMENT
set -euo pipefail
cd "$(dirname "$0")/.."
pip_audit=$1
torch_requirement=$2
python=$(dirname "$pip_audit")/python
probe=https://pypi.org/pypi/pip/24.0/json
if ! "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)" "$probe" 2>/dev/null; then
  echo "audit: NOT RUN: pip-audit's vulnerability service (PyPI's per-release JSON API, e.g. $probe) is not reachable from here"
  [ "${AUDIT_REQUIRED:-0}" = 1 ] && exit 1
  exit 0
fi
ignored=()
while read -r id _; do
  ignored+=(--ignore-vuln "$id")
done < <(grep -v '^\s*\(#\|$\)' requirements/audit-exceptions.txt)
torch=$(mktemp)
trap 'rm -f "$torch"' EXIT
echo "$torch_requirement" >"$torch"
locks=()
for lock in requirements/*.txt; do
  [ "$lock" = requirements/audit-exceptions.txt ] || locks+=(-r "$lock")
done
"$pip_audit" --strict --disable-pip --no-deps --progress-spinner off "${locks[@]}" -r "$torch" "${ignored[@]}"
