#!/usr/bin/env bash
# `make audit`: pip-audit of every lock file in requirements/ plus torch, against the advisories of PyPI's
# per-release JSON API. Each exception is an advisory id in requirements/audit-exceptions.txt with its reason.
# Where that API is not served (a registry mirror that has only the project pages), pip-audit cannot run (its
# other services, OSV and ecosyste.ms, are other hosts): this says so and falls back to
# scripts/audit_newest.py, which audits the pins that are their package's newest release with PyPI's project
# JSON API and lists the others as NOT AUDITED with the reason each cannot move (a newer release needs a newer
# Python, or a `NAME==VERSION reason` line of the exceptions file); an older pin without a reason fails.
# Without any network nothing is audited: NOT RUN, exit 0.
# With AUDIT_REQUIRED=1 anything short of a full pip-audit is a failure.
# Usage: scripts/audit.sh PIP_AUDIT TORCH_REQUIREMENT
set -euo pipefail
cd "$(dirname "$0")/.."
pip_audit=$1
torch_requirement=$2
python=$(dirname "$pip_audit")/python
torch=$(mktemp)
trap 'rm -f "$torch"' EXIT
echo "$torch_requirement" >"$torch"
locks=()
for lock in requirements/*.txt; do
  [ "$lock" = requirements/audit-exceptions.txt ] || locks+=("$lock")
done
probe=https://pypi.org/pypi/pip/24.0/json
if ! reason=$("$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)" "$probe" 2>&1); then
  echo "audit: pip-audit NOT RUN: its vulnerability service, PyPI's per-release JSON API, is not served here:"
  echo "audit:   GET $probe -> ${reason##*$'\n'}"
  echo "audit: fallback: the advisories of each package's newest release (PyPI's project JSON API)"
  status=0
  "$python" scripts/audit_newest.py requirements/audit-exceptions.txt "${locks[@]}" "$torch" || status=$?
  [ "${AUDIT_REQUIRED:-0}" = 1 ] && exit 1
  [ "$status" = 2 ] && exit 0  # not reachable: NOT RUN, said above
  exit "$status"
fi
ignored=()
while read -r id _; do
  [[ $id == *==* ]] || ignored+=(--ignore-vuln "$id")  # NAME==VERSION lines explain older pins (the fallback's)
done < <(grep -v '^\s*\(#\|$\)' requirements/audit-exceptions.txt)
requirements=()
for lock in "${locks[@]}" "$torch"; do
  requirements+=(-r "$lock")
done
"$pip_audit" --strict --disable-pip --no-deps --progress-spinner off "${requirements[@]}" "${ignored[@]}"
