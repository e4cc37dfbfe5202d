#!/usr/bin/env bash
# Sets up audiollm on a Debian machine with Python 3.11:
#   bash setup.sh          system packages (espeak-ng) + .venv with the project
#   bash setup.sh --test   the same, plus what the test suite needs (a local SLURM
#                          cluster's packages, pytest)
# Idempotent: re-running installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")"

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

apt_packages=(espeak-ng libsndfile1)
if [ "$want_test" = 1 ]; then
  # A real single-node SLURM with accounting (tests/slurm/start_slurm.sh starts it).
  apt_packages+=(slurm-wlm slurmdbd munge mariadb-server)
fi
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null || python_bin=python3
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
extras=""
[ "$want_test" = 1 ] && extras="[test]"
echo "setup: installing the project into .venv"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".${extras}"
echo "setup: done (.venv/bin/audiollm --help)"
