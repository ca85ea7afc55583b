#!/usr/bin/env bash
# The issue-16 GPU targets for one model, in two steps that each fit a 10-minute device command:
#   scripts/tune_targets.sh MODEL build OUT   export with a dynamic batch (B=1:16), then
#                                             aotc build --mode reduce-overhead --tune --specialize B=1,8,16
#   scripts/tune_targets.sh MODEL bench OUT   aotc bench at 1, 8, 16 against torch.compile default and
#                                             reduce-overhead (each size compiled for itself), and the GPU
#                                             kernels of the package against torch.compile's
# MODEL: densenet121 | resnet50 | bert_base. Work in $WORK (default /tmp/tt); results in OUT.
# $CANDIDATES (default freezing) and $JOBS (default 8) go to --tune-candidates / --tune-jobs.
set -eu
model=$1 step=$2 out=$3
work=${WORK:-/tmp/tt}
mkdir -p "$work" "$out"
export AOTC_CACHE_DIR=$work/tune-cache TORCHINDUCTOR_CACHE_DIR=$work/inductor-cache PYTHONUNBUFFERED=1
case $model in
  densenet121) export_args=(torchvision.models:densenet121 --input-shape Bx3x128x128 --dim B=1:16:16) ;;
  resnet50) export_args=(torchvision.models:resnet50 --input-shape Bx3x224x224 --dim B=1:16:16) ;;
  bert_base) export_args=(tests/zoo/gpu/bert_base.py --dim "B=1:16:8@input_ids:0,attention_mask:0") ;;
  *) echo "unknown model $model" >&2; exit 2 ;;
esac
pkg=$work/$model-tuned
# the tuned, specialized build into $1, timed (the same command for the first run and the rerun)
tuned_build() {
  /usr/bin/time -f "%e s wall" aotc build "$work/$model.pt2" --device cuda --mode reduce-overhead --tune \
    --tune-candidates "${CANDIDATES:-freezing}" --tune-jobs "${JOBS:-8}" \
    --specialize B=1,8,16 -o "$1" --force
}
case $step in
  build)
    aotc export "${export_args[@]}" -o "$work/$model.pt2" --force
    tuned_build "$pkg" 2>&1 | tee "$out/$model-build.txt"
    python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(json.dumps(m['tuning'], indent=1))" \
      "$pkg/manifest.json" > "$out/$model-tuning.json" ;;
  rebuild)  # the same command again: the cache's share of the first build's time
    tuned_build "$pkg-again" 2>&1 | tail -3 | tee "$out/$model-rebuild.txt" ;;
  bench)
    aotc bench "$pkg" --batch-sizes 1,8,16 --against compile:default,compile:reduce-overhead \
      --no-cold-start --iters 200 --rounds 10 --json "$out/$model-bench.json" 2>&1 | tee "$out/$model-bench.txt" ;;
  profile)
    python3 scripts/kernels_by_package.py "$pkg" --batch-sizes 1,8,16 --compile reduce-overhead \
      --json "$out/$model-kernels.json" > "$out/$model-kernels.txt" 2>&1 ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
