#!/usr/bin/env bash
# What issues 3 and 5 need from the GPU machine, in one unattended run (the device tool's calls are
# short; this runs in the background and they poll it). Results: $RESULTS/{*.log,*.json,*.txt}.
# usage: setsid nohup scripts/gpu_session.sh RESULTS_DIR WORKDIR STEP... &
# steps, run in the order given:
#   tests_a   GPU tests except max-autotune     bench_a  densenet121 bench, default + reduce-overhead
#   tests_b   max-autotune round trip           bench_b  densenet121 bench, all three modes
#   ro_freeze densenet121 reduce-overhead built with and without freezing, side by side
#   suite=M1,M2  bench_suite.py on those torchvision models (reduce-overhead packages), page in docs/
#   ma_probe  scripts/probe_max_autotune.py, every variant (which Inductor setting makes max-autotune slow)
#   kernels   GPU time per kernel of the densenet121 packages built so far, side by side
#   zoo_gpu   scripts/zoo.py on the realistic-size list (tests/zoo/gpu), reduce-overhead, with torch.compile RO
#   zoo_small scripts/zoo.py on the small transformers zoo, reduce-overhead, without the torch.compile column
#   tests_zoo the GPU tests of the zoo and of the build defaults (auto device, cuda:0 placement)
#   ma_build  densenet121 max-autotune build alone, timed, with a progress log every 30 s
#             ($RESULTS/ma_progress.txt: kernels tuned so far); nothing else runs beside it
# Inductor's cache lives in $WORK/inductor_cache; a tarball of tuning results from an earlier
# machine at .gpu/tuning.tgz (carried) is unpacked into it first, so a build cut off by the
# machine's 30-minute hold can go on where it stopped on the next one (scripts/gpu_save_tuning.sh makes it).
set -u
RESULTS=${1:-/tmp/gpu_out}
WORK=${2:-/tmp/gpuw}
shift 2
mkdir -p "$RESULTS" "$WORK"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 AOTC_GPU_WORKDIR=$WORK TORCHINDUCTOR_CACHE_DIR=$WORK/inductor_cache
mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
[ -f .gpu/tuning.tgz ] && tar xzf .gpu/tuning.tgz -C "$TORCHINDUCTOR_CACHE_DIR"
log() { echo "[$(date +%T)] $*" | tee -a "$RESULTS/session.log"; }

log "install"
python3 -m pip install -q --no-deps --no-build-isolation -e ./runtime -e . > "$RESULTS/install.log" 2>&1 || log "install failed"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > "$RESULTS/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> "$RESULTS/gpu.txt" 2>&1
python3 -c "from aotc import toolchain as t; print('compiler choice:', t.choose_compiler())" >> "$RESULTS/gpu.txt" 2>&1

for step in "$@"; do
  log "start $step"
  case $step in
    zoo_gpu) python3 scripts/zoo.py --device cuda --set gpu --mode reduce-overhead --jobs 4 --iters 100 --work "$WORK/zoo" \
               --json "$RESULTS/zoo_gpu.json" --out "$RESULTS/zoo_gpu.md" > "$RESULTS/zoo_gpu.log" 2>&1 ;;
    zoo_small) python3 scripts/zoo.py --device cuda --set zoo --mode reduce-overhead --jobs 6 --iters 100 --no-compile \
               --work "$WORK/zoo" --json "$RESULTS/zoo_small.json" --out "$RESULTS/zoo_small.md" > "$RESULTS/zoo_small.log" 2>&1 ;;
    tests_zoo) python3 -m pytest -q -m gpu tests/test_zoo.py tests/test_build_defaults.py -p no:cacheprovider > "$RESULTS/tests_zoo.log" 2>&1 ;;
    tests_a) python3 -m pytest -q -m gpu tests/test_gpu.py -k "not max-autotune" -p no:cacheprovider > "$RESULTS/tests_a.log" 2>&1 ;;
    tests_b) python3 -m pytest -q -m gpu tests/test_gpu.py -k "max-autotune" -p no:cacheprovider > "$RESULTS/tests_b.log" 2>&1 ;;
    bench_a) python3 scripts/bench_gpu.py --workdir "$WORK" --modes default,reduce-overhead --json "$RESULTS/bench_a.json" > "$RESULTS/bench_a.txt" 2>&1 ;;
    bench_b) python3 scripts/bench_gpu.py --workdir "$WORK" --json "$RESULTS/bench_b.json" > "$RESULTS/bench_b.txt" 2>&1 ;;
    ro_freeze)
      [ -f "$WORK/densenet121.pt2" ] || python3 -m aotc export torchvision.models:densenet121 --input-shape 16x3x128x128 -o "$WORK/densenet121.pt2" > "$RESULTS/ro_freeze.txt" 2>&1
      python3 -m aotc build "$WORK/densenet121.pt2" --device cuda --mode reduce-overhead --option freezing=true -o "$WORK/densenet121_ro_frozen" --force --quiet >> "$RESULTS/ro_freeze.txt" 2>&1
      python3 scripts/bench_gpu.py --workdir "$WORK" --modes reduce-overhead --extra "reduce-overhead frozen=$WORK/densenet121_ro_frozen" \
        --cold-runs 1 --json "$RESULTS/ro_freeze.json" >> "$RESULTS/ro_freeze.txt" 2>&1
      cp "$WORK/densenet121_ro_frozen/manifest.json" "$RESULTS/manifest_ro_frozen.json" ;;
    ma_probe)
      for v in base no_coordesc no_prologue no_epilogue_bench; do
        timeout 300 python3 scripts/probe_max_autotune.py $v >> "$RESULTS/ma_probe.jsonl" 2>> "$RESULTS/ma_probe.err"; done
      timeout 300 python3 scripts/probe_max_autotune.py base --post >> "$RESULTS/ma_probe.jsonl" 2>> "$RESULTS/ma_probe.err" ;;
    ma_build)
      [ -f "$WORK/densenet121.pt2" ] || python3 -m aotc export torchvision.models:densenet121 --input-shape 16x3x128x128 -o "$WORK/densenet121.pt2" > "$RESULTS/ma_build.txt" 2>&1
      ( start=$(date +%s); while sleep 30; do
          echo "$(( $(date +%s) - start )) s: $(find "$TORCHINDUCTOR_CACHE_DIR" -name '*.best_config' | wc -l) kernels tuned," \
               "$(find "$TORCHINDUCTOR_CACHE_DIR" -name 'c*.py' -path '*/triton*' -o -name '*.py' -newer "$WORK/densenet121.pt2" | wc -l) kernel sources," \
               "load $(cut -d' ' -f1 /proc/loadavg)" >> "$RESULTS/ma_progress.txt"; done ) &
      monitor=$!
      python3 -m aotc --verbose build "$WORK/densenet121.pt2" --device cuda --mode max-autotune -o "$WORK/densenet121_max-autotune" --force >> "$RESULTS/ma_build.txt" 2>&1
      kill $monitor
      # one PTX version in Triton's cache = build process and compile workers used one ptxas (aotc/ptxas.py)
      grep -h '^\.version' "$TORCHINDUCTOR_CACHE_DIR"/triton/*/*/*.ptx | sort | uniq -c > "$RESULTS/ptx_versions.txt" ;;
    kernels) python3 scripts/kernels_by_package.py $(ls -d "$WORK"/densenet121_*/ 2>/dev/null) --json "$RESULTS/kernels.json" > "$RESULTS/kernels.txt" 2>&1 ;;
    suite=*) python3 scripts/bench_suite.py --device cuda --out docs --work "$WORK/suite" --models "${step#suite=}" \
               --mode reduce-overhead --against eager,compile:default,compile:reduce-overhead --cold-runs 1 >> "$RESULTS/suite.log" 2>&1
             mkdir -p "$RESULTS/docs" && cp -r docs/bench docs/bench_suite_cuda.md "$RESULTS/docs/" ;;
    *) log "unknown step $step" ;;
  esac
  log "end $step rc=$?"
  for m in default reduce-overhead max-autotune; do cp "$WORK/densenet121_$m/manifest.json" "$RESULTS/manifest_$m.json" 2>/dev/null; done
done
log "done"
touch "$RESULTS/DONE"
