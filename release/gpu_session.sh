#!/usr/bin/env bash
# Issue 61's GPU checks in one device call (at most 10 minutes; a session is
# lent 15 minutes of device time in all). Prepare here first:
#
#     bash release/gpu_wheels.sh            # .whl/: Ray (stripped) and what the GPU image lacks, ~46 MiB
#
# then, with the device tool, one call per line while the session's device time lasts (15 minutes,
# the machine's start included; each call at most 10):
#
#     run(command="bash release/gpu_session.sh", carry=[".whl"], timeout_s=600)
#     run(command="bash release/gpu_session.sh overhead gpu", carry=[".whl"], timeout_s=600)
#
# Parts, in the order named (the first call's by default), each within what is left of SESSION_S
# seconds (570 by default, under the call's 600); a bench starts no repeat that would end past its
# part's limit (--time-budget), so a part cut short still prints its section with the repeats done:
#   resnet20  issue 61's points 1 and 4: bench_gpu.py --study resnet20 (ResNet-20 on 50,000 images,
#             32 trials, merge rate 3.69, 4 slots of 0.25 GPU), Tune reuse_actors=True against
#             ray_stagetree, 2 interleaved repeats, with the breakdown by phase, the wall time in parts
#             and the makespan against its replay (at most 420 s);
#   deterministic  point 4's bit-for-bit check on the GPU: the ResNet-20 study's --quick size with
#             deterministic algorithms, each merged trial against it trained alone (at most 130 s);
#   overhead  point 5: Tune's bookkeeping shape at 1,600 trials on the machine's 16 CPUs (Tune
#             reuse_actors=True and ray_stagetree, one repeat; at most 330 s);
#   gpu       the small study of RESULTS.md (bench_gpu.py --full, 2 repeats), in what is left;
#   imports   nothing more than what every call checks before its parts: that the copied scripts import.
# Each part's markdown section and its log land in $OUT; RESULTS.md keeps the machine and commit of
# each figure.
#
# Dry run, where there is no GPU (the whole path: the carried wheels, the scratch copy, every part's
# imports and a small run of each on CPU), with python3 on PATH a Python 3.12 that holds torch and the
# GPU image's other packages (KINDS.md lists them):
#
#     GPU_SESSION_DRY_RUN=wheels bash release/gpu_session.sh resnet20 deterministic overhead gpu
#
# GPU_SESSION_DRY_RUN=1 does the same with the packages python3 holds, not the carried wheels
# (tests/test_release_quick.py runs the part `imports` so: the scratch copy holds what the parts import).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_session_out}
mkdir -p "$out"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(resnet20 deterministic)
deadline=$(( $(date +%s) + ${SESSION_S:-570} ))

if [ -z "${GPU_SESSION_DRY_RUN:-}" ] || [ "$GPU_SESSION_DRY_RUN" = wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$repo"/.whl/*.whl || { echo "install failed: run release/gpu_wheels.sh here and carry .whl"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
# Ray puts the driver's folder on its workers' path: run from a copy of release/, away from the repo's
# ray_stagetree/ (which lacks searchers/ and trainables/ and would shadow the installed package); with
# examples/ beside it, where bench_tune.py (which bench_gpu.py imports) finds mnist1d_study.py.
STAGETREE_RELEASE_COMMIT=$(cd "$repo/release" && python3 -c "import harness; print(harness.commit())")
export STAGETREE_RELEASE_COMMIT  # the checkout's, which the copy's sections name
scratch=$(mktemp -d /tmp/stagetree_gpu_XXXX)
trap 'rm -rf "$scratch"' EXIT
cp -r "$repo/release" "$repo/examples" "$scratch/"
cd "$scratch/release"
# Before any device time goes on a part: what the parts run imports from here.
python3 -c "import bench_gpu, bench_overhead" || { echo "the copied scripts do not import (above): no part runs"; exit 1; }
echo "== imports: bench_gpu.py and bench_overhead.py import from the scratch copy"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 --version;
  python3 -c "import torch, ray, ray_stagetree; print('torch', torch.__version__, 'ray', ray.__version__, 'ray_stagetree', ray_stagetree.__version__)";
  echo "commit $STAGETREE_RELEASE_COMMIT"; } > "$out/machine.txt" 2>&1

run_part() {  # name, most seconds, command...: runs within what is left of the session
    local name=$1 most=$2; shift 2
    local left=$(( deadline - $(date +%s) ))
    local limit=$(( most < left ? most : left ))
    if [ "$left" -lt 60 ]; then echo "== $name: skipped, ${left}s left"; return; fi
    echo "== $name (at most ${limit}s): $*"
    # The bench's own budget leaves it time to print its section; the timeout is the last resort.
    timeout "$limit" "$@" --time-budget $(( limit - 40 )) > "$out/$name.md" 2> "$out/$name.log"
    echo "   exit $?; $(head -c 300 "$out/$name.md" | tr '\n' ' ')"
}
resnet20=(--gpu-per-trial 0.25 --repeats 2) quick=(--quick) small=(--full --repeats 2)
overhead_size=(--trials 1600 --workers 16) deterministic_s=130
if [ -n "${GPU_SESSION_DRY_RUN:-}" ]; then  # CPUs train ResNet-20 slower: the bit-for-bit check takes 2.5 minutes on 2
    resnet20=(--device cpu --quick) quick=(--device cpu --quick) small=(--device cpu --quick)
    overhead_size=(--trials 32 --workers 2) deterministic_s=240
fi
for part in "${parts[@]}"; do
    case $part in
        resnet20) run_part resnet20 420 python3 bench_gpu.py --study resnet20 "${resnet20[@]}" ;;
        deterministic) run_part deterministic "$deterministic_s" python3 bench_gpu.py --study resnet20 "${quick[@]}" --deterministic ;;
        overhead) run_part overhead 330 python3 bench_overhead.py "${overhead_size[@]}" --iterations 1 \
            --seconds 1 --sections short --systems "Ray Tune reuse,ray_stagetree" --repeats 1 ;;
        gpu) run_part gpu 390 python3 bench_gpu.py "${small[@]}" ;;
        imports) ;;  # checked above
        *) echo "unknown part $part (imports, resnet20, deterministic, overhead, gpu)"; exit 2 ;;
    esac
done
