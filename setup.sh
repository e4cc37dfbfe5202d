#!/usr/bin/env bash
# Sets up audiollm on a Debian machine with Python 3.11:
#   bash setup.sh          system packages (espeak-ng) + .venv with the project
#   bash setup.sh --test   the same, plus what the test suite needs (a local SLURM
#                          cluster's packages, pytest)
#   bash setup.sh --hf     the same as the first, plus HF datasets (`audiollm data import hf`)
#   bash setup.sh --voxtral  the same as the first, plus mistral-common (Voxtral's Tekken tokenizer)
#   bash setup.sh --from-wheels DIR [SITE]
#                          on a GPU machine without internet: the project and its job
#                          side from the wheels `audiollm wheels [--kit] DIR` wrote on a
#                          connected machine, installed beside the machine's own torch
#                          into SITE (default .kit-site) with pip --target; then
#                          `export PYTHONPATH=SITE` (printed). Works where python3 is
#                          itself a virtual environment, which a venv made from it
#                          would not see through.
# Idempotent: re-running installs only what is missing. Installs with uv (pip as the
# fallback, or with AUDIOLLM_INSTALLER=pip), at the versions in constraints.txt
# (AUDIOLLM_UNPINNED=1: the newest pyproject.toml allows).
set -euo pipefail
cd "$(dirname "$0")"

if [ "${1:-}" = "--from-wheels" ]; then
  wheels="${2:?usage: bash setup.sh --from-wheels DIR [SITE]}"
  site="$(realpath -m "${3:-.kit-site}")"
  python_bin="${PYTHON:-python3}"
  "$python_bin" -c "import torch" 2>/dev/null || { echo "setup: $python_bin has no torch; install the machine's CUDA build first" >&2; exit 1; }
  echo "setup: installing the project from $wheels into $site (no index, no dependencies resolved)"
  "$python_bin" -m pip install -q --no-index --no-deps --upgrade --target "$site" "$wheels"/*.whl
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$python_bin" -c "import torch, megatron.core, orchestrator.models.audiollm; print('setup: done; torch', torch.__version__, 'CUDA', torch.version.cuda)"
  echo "setup: now  export PYTHONPATH=$site  and run  $python_bin -m orchestrator.cli ...  (or $site/bin/audiollm)"
  exit 0
fi

want_test=0
[ "${1:-}" = "--test" ] && want_test=1
want_hf=0
[ "${1:-}" = "--hf" ] && want_hf=1
want_voxtral=0
[ "${1:-}" = "--voxtral" ] && want_voxtral=1

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

apt_packages=(espeak-ng libsndfile1)
if [ "$want_test" = 1 ]; then
  # A real single-node SLURM with accounting (tests/slurm/start_slurm.sh starts it), and the
  # namespace tools of the multi-node one (tests/slurm/start_cluster.sh); a C compiler for
  # the libpcaudio stub of benchmarks/espeak_kit.py (tests/orchestrator/test_espeak_kit.py).
  apt_packages+=(slurm-wlm slurmdbd munge mariadb-server iproute2 util-linux gcc libc6-dev)
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
[ "$want_hf" = 1 ] && extras="[hf]"
[ "$want_voxtral" = 1 ] && extras="[voxtral]"
echo "setup: installing the project into .venv"
# uv installs torch and its ~3 GB of CUDA libraries in about 30 s where pip takes about
# 100 s (2-core machine, cold caches). uv reads no pip configuration: where pip needs its
# own (a private index, a proxy), AUDIOLLM_INSTALLER=pip uses pip; a failed uv install
# falls back to pip as well. --compile-bytecode, as pip does by default: where
# PYTHONDONTWRITEBYTECODE is set, a process would otherwise compile torch, megatron and
# transformers from source at every start (importing them took 19 s instead of 7.5 s;
# the compilation costs about 33 s once, on 2 cores).
# Within the versions the test suite passed with (constraints.txt); AUDIOLLM_UNPINNED=1
# takes the newest that pyproject.toml's ranges allow.
constraints=(-c constraints.txt)
[ "${AUDIOLLM_UNPINNED:-0}" = 1 ] && constraints=()
installed=0
if [ "${AUDIOLLM_INSTALLER:-uv}" = uv ]; then
  if .venv/bin/python -m pip install -q uv && \
     .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python --upgrade pip -e ".${extras}" \
       "${constraints[@]}"; then
    installed=1
  else
    echo "setup: uv could not install the project; installing with pip instead" >&2
  fi
fi
if [ "$installed" = 0 ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".${extras}" "${constraints[@]}"
fi
echo "setup: done (.venv/bin/audiollm --help)"
