#!/usr/bin/env bash
# Everything slhub could not check without a CUDA device, as one prepared run for a
# session that is lent one (the `run` tool: one H200, torch 2.11, no pydantic or
# structlog). Results go under $OUT (one log per check and summary.txt).
#
#   here:   pip download --only-binary=:all: --python-version 3.12 \
#             --platform manylinux2014_x86_64 -d .whl pydantic structlog pytest
#   device: bash scripts/device_check.sh          (carry .whl; timeout_s 540)
#   dry run of the script itself on a CPU machine (6 minutes; measures nothing about GPUs;
#   gpu_overhead's large size cannot finish on 2 CPU cores within its limit, and fp16-mixed
#   is refused without CUDA: both fail there, the other three pass):
#           DEVICE=cpu RECIPE=examples/sl_ddp/cpu.yaml \
#             OVERHEAD_ARGS="--updates 100 --repeats 1" bash scripts/device_check.sh
#
# Checks, each under its own time limit (about 8 minutes in all):
#   gpu_overhead      benchmarks/gpu_overhead.py: the GPU rows of issue 11 (both sizes)
#                     and the synchronizing CUDA calls per update, by call site
#   nccl_train        torchrun with NCCL (world size 1 on one GPU), the sl_ddp CUDA recipe:
#                     the group forms on the GPU; a group of one runs no collective
#                     (its agreement and gathers are local), so NCCL's collectives
#                     need 2+ GPUs
#   resume_exact      stopped at update 6 and resumed on the GPU: bit-identical to the
#                     uninterrupted run (model, optimizer, every rank's state, CUDA RNG)
#   fp16_mixed        the same with trainer.precision=fp16-mixed (autocast, GradScaler)
#   host_reads        tests/test_host_reads.py (the CPU counting, as a cross-check)
set -u
OUT=${OUT:-/tmp/slhub-device}
DEVICE=${DEVICE:-cuda}
RECIPE=${RECIPE:-examples/sl_ddp/cuda.yaml}
OVERHEAD_ARGS=${OVERHEAD_ARGS:-}
mkdir -p "$OUT"
: >"$OUT/summary.txt"
if compgen -G ".whl/*.whl" >/dev/null; then
    pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
fi
export OMP_NUM_THREADS=1

check() {  # check NAME SECONDS COMMAND...: its log in $OUT/NAME.log, its status in summary.txt
    local name=$1 limit=$2 started
    shift 2
    started=$(date +%s)
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "$name: exit $? in $(($(date +%s) - started)) s" | tee -a "$OUT/summary.txt"
    tail -n 30 "$OUT/$name.log"
}

cat >"$OUT/resume_exact.py" <<'PY'
"""resume_exact.py OUT RECIPE [SETTING ...]: check_resume_exact at update 6 of 12."""
import sys
from pathlib import Path

from slhub.testing import check_resume_exact

out, recipe, extra = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
name = "resume-" + ("-".join(s.split("=")[-1] for s in extra) or "fp32")
check = check_resume_exact(
    recipe, stop_at=6, workdir=out / name, workers=1, cwd=Path.cwd(),
    overrides=["trainer.steps=12", "trainer.validate_every=4", "trainer.save_every=4", *extra],
)
final = check.final("resumed")
print("bit-identical after resume at update 6 of 12:", name, "step", final.step)
print("CUDA RNG state in the checkpoint:", final.ranks[0]["rng"]["cuda"] is not None)
PY

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
python -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0))" \
    | tee "$OUT/torch.txt"
# shellcheck disable=SC2086 # OVERHEAD_ARGS is a list of arguments
check gpu_overhead 300 python benchmarks/gpu_overhead.py --device "$DEVICE" $OVERHEAD_ARGS
check nccl_train 90 torchrun --standalone --nproc-per-node=1 -m slhub train \
    --config "$RECIPE" --set "trainer.output_dir=$OUT/nccl" --log-format json
check resume_exact 90 python "$OUT/resume_exact.py" "$OUT" "$RECIPE"
check fp16_mixed 90 python "$OUT/resume_exact.py" "$OUT" "$RECIPE" trainer.precision=fp16-mixed
check host_reads 60 python -m pytest -q -p no:cacheprovider tests/test_host_reads.py
cat "$OUT/summary.txt"
