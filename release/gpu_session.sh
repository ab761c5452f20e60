#!/usr/bin/env bash
# Issue 61's GPU checks in one device call (at most 10 minutes; a session is
# lent 15 minutes of device time in all). Prepare here first:
#
#     bash release/gpu_wheels.sh            # .whl/: Ray (stripped) and what the GPU image lacks, ~46 MiB
#
# then, with the device tool: run(command="bash release/gpu_session.sh", carry=[".whl"], timeout_s=600).
# Parts, in order (name some to run only those): gpu (bench_gpu.py --full,
# 2 interleaved repeats, with the breakdown by phase and the makespan over
# its lower bound), overhead (Tune's bookkeeping shape at 320 trials on the
# machine's 16 CPUs). Each part's markdown section and its log land in $OUT;
# RESULTS.md keeps the machine and commit of each figure.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_session_out}
mkdir -p "$out"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(gpu overhead)

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$repo"/.whl/*.whl \
    || { echo "install failed: run release/gpu_wheels.sh here and carry .whl"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# Ray puts the driver's folder on its workers' path: run from a copy of release/, away from the repo's
# ray_stagetree/ (which lacks searchers/ and trainables/ and would shadow the installed package).
scratch=$(mktemp -d /tmp/stagetree_gpu_XXXX)
cp -r "$repo/release" "$scratch/"
cd "$scratch/release"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 --version;
  python3 -c "import torch, ray, ray_stagetree; print('torch', torch.__version__, 'ray', ray.__version__, 'ray_stagetree', ray_stagetree.__version__)";
  git -C "$repo" rev-parse --short HEAD 2>/dev/null; } > "$out/machine.txt" 2>&1

run_part() {  # name, seconds, command...
    local name=$1 limit=$2; shift 2
    echo "== $name (at most ${limit}s): $*"
    timeout "$limit" "$@" > "$out/$name.md" 2> "$out/$name.log"
    echo "   exit $?; $(head -c 300 "$out/$name.md" | tr '\n' ' ')"
}
for part in "${parts[@]}"; do
    case $part in
        gpu) run_part gpu 390 python3 bench_gpu.py --full --repeats 2 ;;
        overhead) run_part overhead 150 python3 bench_overhead.py --trials 320 --workers 16 --iterations 1 --seconds 1 \
            --sections short --repeats 1 ;;
        *) echo "unknown part $part (gpu, overhead)"; exit 2 ;;
    esac
done
