#!/usr/bin/env bash
# `make system-deps`: install with apt-get the Debian packages whose binary is missing.
# Arguments: BINARY=PACKAGE words, e.g. redis-server=redis-server (SYSTEM_DEPS in the Makefile).
set -euo pipefail
missing=()
for pair in "$@"; do
  binary=${pair%%=*}
  package=${pair#*=}
  command -v "$binary" >/dev/null 2>&1 || missing+=("$package")
done
((${#missing[@]})) || exit 0
if ! command -v apt-get >/dev/null; then
  echo "system-deps: install these packages with your system's package manager: ${missing[*]}" >&2
  exit 1
fi
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "==> installing Debian packages: ${missing[*]}"
# Wait for another apt or dpkg run to finish instead of failing on its lock.
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -q)
"${apt[@]}" update -qq
"${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}"
