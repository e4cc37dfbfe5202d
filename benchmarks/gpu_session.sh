#!/usr/bin/env bash
# A lent GPU machine's session, run from the root of a copy of this checkout that carries
# .whl/kit and .whl/demo (docs/gpu-machines.md: `audiollm wheels .whl/kit --kit ...` and
# `audiollm data demo .whl/demo ...` made them on a connected machine). It installs the kit
# once (.kit-site stays on a machine kept between calls), then runs the acceptance's rows
# in the order they matter, each group under its own time limit, so that one call stays
# within a 10-minute limit and every row measured is kept in $OUT (default gpu-out) as it
# comes, even where a limit cuts a group short.
#
#   bash benchmarks/gpu_session.sh 1   # the acceptance's checks and the 2b job (at most 9 min)
#   bash benchmarks/gpu_session.sh 2   # the 9B job: two launches, a save of 18 GB, a resume (at most 9.5 min)
#   bash benchmarks/gpu_session.sh 3   # the default recipe's job rows (passed on an H100 before)
set -u
part=${1:?usage: bash benchmarks/gpu_session.sh 1|2|3}
out=${OUT:-gpu-out}
mkdir -p "$out"
if [ ! -d .kit-site ]; then
    bash setup.sh --from-wheels .whl/kit .kit-site > "$out/setup.log" 2>&1 || { tail -20 "$out/setup.log"; exit 1; }
fi
export PYTHONPATH=$PWD/.kit-site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
git rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null

acceptance() {  # SECONDS NAME CHECK-ARGUMENTS...
    local limit=$1 name=$2
    shift 2
    timeout "$limit" python3 benchmarks/gpu_acceptance.py --demo-corpus .whl/demo --json "$out/$name.json" "$@" \
        > "$out/$name.log" 2>&1
    echo "$name: exit $? (limit ${limit} s)"
    sed -n '/^| check/,$p' "$out/$name.log"
}

case $part in
    1)
        acceptance 300 checks --only parity,lora,recompiles,throughput,generation,encoder,fp8 --profile "$out/profile"
        acceptance 230 job2b --only job2b
        ;;
    2)
        acceptance 570 job9b --only job9b
        ;;
    3)
        acceptance 400 job --only job
        ;;
    *)
        echo "part $part: 1, 2 or 3" >&2
        exit 2
        ;;
esac
