#!/usr/bin/env bash
# Everything issue 3 needs from the GPU machine, in one unattended run (the device tool's calls are
# short; this runs in the background and they wait on it). Results: $RESULTS/{*.log,*.json,*.txt}.
# usage: setsid nohup scripts/gpu_session.sh RESULTS_DIR WORKDIR &
set -u
RESULTS=${1:-/tmp/gpu_out}
WORK=${2:-/tmp/gpuw}
mkdir -p "$RESULTS" "$WORK"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 AOTC_GPU_WORKDIR=$WORK
log() { echo "[$(date +%T)] $*" | tee -a "$RESULTS/session.log"; }

log "install"
python3 -m pip install -q --no-deps --no-build-isolation -e ./runtime -e . > "$RESULTS/install.log" 2>&1 || log "install failed"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > "$RESULTS/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> "$RESULTS/gpu.txt" 2>&1

python3 -c "from aotc import toolchain as t; print('compiler choice:', t.choose_compiler()); print('headers:', [(c, t.compiler_gcc_release(c)) for c in t.candidate_compilers()])" >> "$RESULTS/gpu.txt" 2>&1

log "phase A: GPU tests except max-autotune"
python3 -m pytest -q -m gpu tests/test_gpu.py -k "not max-autotune" -p no:cacheprovider > "$RESULTS/tests_a.log" 2>&1
log "phase A tests rc=$?"
log "phase A: benchmark default + reduce-overhead"
python3 scripts/bench_gpu.py --workdir "$WORK" --modes default,reduce-overhead --json "$RESULTS/bench_a.json" > "$RESULTS/bench_a.txt" 2>&1
log "phase A bench rc=$?"

log "suite (issue 5): densenet121 and resnet50, reduce-overhead packages"
python3 scripts/bench_suite.py --device cuda --out "$RESULTS/suite" --work "$WORK/suite" --models densenet121 \
  --mode reduce-overhead --against eager,compile:default,compile:reduce-overhead --cold-runs 1 > "$RESULTS/suite.log" 2>&1
log "suite rc=$?"

log "phase B: max-autotune test and benchmark of all modes"
python3 -m pytest -q -m gpu tests/test_gpu.py -k "max-autotune" -p no:cacheprovider > "$RESULTS/tests_b.log" 2>&1
log "phase B tests rc=$?"
python3 scripts/bench_gpu.py --workdir "$WORK" --json "$RESULTS/bench_b.json" > "$RESULTS/bench_b.txt" 2>&1
log "phase B bench rc=$?"
for m in default reduce-overhead max-autotune; do cp "$WORK/densenet121_$m/manifest.json" "$RESULTS/manifest_$m.json" 2>/dev/null; done
log "done"
touch "$RESULTS/DONE"
