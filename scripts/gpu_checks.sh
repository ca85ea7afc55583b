#!/usr/bin/env bash
# The maintained checks on a GPU machine, in one unattended run: the GPU tests, the model zoo on the GPU,
# the `aotc bench` suite on the GPU. Logs and results go to RESULTS_DIR; RESULTS_DIR/DONE appears at the end.
# usage: setsid nohup scripts/gpu_checks.sh RESULTS_DIR WORKDIR STEP... &
# steps, run in the order given:
#   tests           the GPU tests (pytest -m gpu) except the densenet121 max-autotune round trip
#   tests_autotune  that round trip alone (its build takes about 7 minutes on an H100)
#   zoo             scripts/zoo.py on the realistic-size GPU list (tests/zoo/gpu), reduce-overhead, with the
#                   torch.compile reduce-overhead column; merged into docs/models.md (copied to RESULTS_DIR/docs/)
#   zoo_small       scripts/zoo.py on the small transformers zoo, reduce-overhead, without the torch.compile column
#   suite[=M1,M2]   scripts/bench_suite.py on the GPU models (or those given), reduce-overhead packages;
#                   docs/bench_suite_cuda.md and docs/bench/ copied to RESULTS_DIR/docs/
#   build_time      scripts/build_time.py on DistilBERT-QA 8x384 (issue 25's target), twice: the first
#                   build on the machine (aotc's CPU-ISA cache empty), then with it warm
#   precision       the GPU tests of bf16 and fp16 builds (tests/test_gpu_precision.py)
#   probes          every package under WORKDIR: how many CPU vector-ISA probes its build ran
#   generate_tests  the GPU generation tests (tests/test_gpu_generate.py: fp32 and bf16, decode as a CUDA graph;
#                   tests/test_gpu_sampling.py: the greedy pick)
#   generate_bench  scripts/generate_bench.py: GPT-2 124M bf16 and fp32 (32-token prompt, 128 new), and the
#                   Llama-3.2-1B shape in bf16 (512-token prompt); JSON records in RESULTS_DIR
#   zoo_bf16[=M,..] scripts/zoo.py --precision bf16 on issue 25's five models (or those given), with the
#                   torch.compile column
#   zoo_probe[=M,..] the GPU list (or the models given) built (fp32, no torch.compile column) only to show
#                   its builds run no CPU-ISA probe; the table goes to RESULTS_DIR, docs/ untouched (then `probes`)
#   decode_contender generate_bench.py bf16, batch 1, 32-token prompt, 288 new, 1,024-token cache: the Llama-3.2-1B
#                   and Qwen3-0.6B shapes against the gpt-fast-style contender, GPT-2 124M alone; JSON in RESULTS_DIR
#   engine_load     GPT-2 124M bf16 (batch 32, 768-token cache) under scripts/engine_load.py: 1 and 32 closed-loop
#                   streams of mixed prompts (16-512 tokens) and max_tokens (16-256), greedy and at OpenAI's
#                   default temperature, in-process (the serve engine without HTTP); JSON in RESULTS_DIR
#   step_cost       scripts/step_cost.py on CUDA: a decode step with 64 tokens in context at 256 and 4,096 positions
#   quantize        the GPU tests of --quantize (tests/test_gpu_quantize.py), then generate_bench.py on the
#                   Llama-3.2-1B shape, bf16, batch 1, 32-token prompt, 288 new: unquantized, int8-weight-only,
#                   int4-weight-only (group 128) and fp8 packages side by side; JSON in RESULTS_DIR
#   quantize_tests  the first half of quantize alone; quantize_bench its second half
#   quantize_profile the Llama-3.2-1B shape (1,024-token cache) built bf16 unquantized and int8-weight-only
#                   (reduce-overhead); scripts/decode_profile.py on both (a step's kernels, idle time, graphs)
#   generate_gpt2   generate_bench's GPT-2 124M part in bf16 alone
#   generate_llama  generate_bench's Llama-3.2-1B part alone
#   tests=EXPR      the GPU tests selected by pytest -k EXPR
#   serve_load      GPT-2 124M bf16 (batch 32, 512-token cache) behind `aotc serve`, loaded with 1, 8 and 32
#                   streams by scripts/completions_load.py beside `aotc generate`'s rate (needs Ray: docs/gpu.md)
#   decode_ab       issue 26's 1B gap: the Llama-3.2-1B shape (1,024-token cache) exported with its sibling
#                   linears stacked (aotc's default: q/k/v and gate/up one GEMM each) and without, built
#                   bf16; scripts/decode_profile.py on both (a step's kernels), then
#                   scripts/generate_bench.py --built on both (decode against the bandwidth floor)
#   cpp_generate    the C++ runner built with CUDA; GPT-2 124M bf16 (batch 1, 256-token cache): cold start to
#                   the first token against import torch + CUDA init (scripts/generate_cold_start.py), and
#                   the runner's decode rate on a 32-token prompt, 128 new tokens, beside `aotc generate`'s
#                   and a bundle of that package (`aotc bundle`) generating under `env -i`, with its size
# Inductor's cache lives in WORKDIR/inductor_cache, so later steps reuse what earlier ones compiled
# (build_time gives each build a fresh one); aotc's cache folder is WORKDIR/aotc_cache.
set -u
if [ $# -lt 3 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,/^set -u/p' "$0" | grep '^#' | cut -c3-
  exit 2
fi
RESULTS=$(realpath -m "$1")
WORK=$(realpath -m "$2")
shift 2
mkdir -p "$RESULTS/docs" "$WORK"
cd "$(dirname "$0")/.."
# The steps run from a copy of the checkout: each device command copies the working tree again,
# and a step that imports a module at that moment can find it missing (seen 2026-11-25)
if [ -z "${AOTC_GPU_CHECKS_COPY:-}" ]; then
  rm -rf "$WORK/tree" && mkdir -p "$WORK/tree"
  tar -cf - --exclude=./.git --exclude=./.gpu/serve --exclude=./.venv . | tar -C "$WORK/tree" -xf -
  AOTC_GPU_CHECKS_COPY=1 exec "$WORK/tree/scripts/gpu_checks.sh" "$RESULTS" "$WORK" "$@"
fi
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$WORK/inductor_cache AOTC_CACHE_DIR=$WORK/aotc_cache
# the checkout's code whether or not the editable install below works (it needs setuptools'
# build backend, which an offline machine may lack)
export PYTHONPATH=$PWD/runtime:$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
log() { echo "[$(date +%T)] $*" | tee -a "$RESULTS/session.log"; }

log "install"
# aotc beside the machine's torch, and the tests' dependencies from .gpu/wheels (docs/gpu.md): the
# same script as `make test-gpu`'s
scripts/gpu_install.sh > "$RESULTS/install.log" 2>&1 || log "install failed: $(tail -1 "$RESULTS/install.log")"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > "$RESULTS/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> "$RESULTS/gpu.txt" 2>&1
python3 -c "from aotc.compiler import toolchain as t; print('compiler choice:', t.choose_compiler())" >> "$RESULTS/gpu.txt" 2>&1

gpt2_file() {  # GPT-2 124M as people write it, random weights
  cat > "$WORK/gpt2_124m.py" <<'PY'
from transformers import GPT2Config, GPT2LMHeadModel


def get_model():
    return GPT2LMHeadModel(GPT2Config())
PY
}

for step in "$@"; do
  log "start $step"
  rc=0
  case $step in
    tests) python3 -m pytest -q -m gpu tests -k "not max-autotune" -p no:cacheprovider > "$RESULTS/tests.log" 2>&1 || rc=$? ;;
    tests_autotune) python3 -m pytest -q -m gpu tests -k "max-autotune" -p no:cacheprovider > "$RESULTS/tests_autotune.log" 2>&1 || rc=$? ;;
    zoo) python3 scripts/zoo.py --device cuda --set gpu --mode reduce-overhead --jobs 4 --iters 100 --work "$WORK/zoo" --merge \
           > "$RESULTS/zoo.log" 2>&1 || rc=$?
         cp docs/models.md docs/models.json "$RESULTS/docs/" ;;
    zoo_small) python3 scripts/zoo.py --device cuda --set zoo --mode reduce-overhead --jobs 6 --iters 100 --no-compile \
                 --work "$WORK/zoo" --merge > "$RESULTS/zoo_small.log" 2>&1 || rc=$?
               cp docs/models.md docs/models.json "$RESULTS/docs/" ;;
    suite|suite=*)
      models=()
      [ "$step" != suite ] && models=(--models "${step#suite=}")
      python3 scripts/bench_suite.py --device cuda --out docs --work "$WORK/suite" ${models[@]+"${models[@]}"} \
        --mode reduce-overhead --against eager,compile:default,compile:reduce-overhead --cold-runs 1 >> "$RESULTS/suite.log" 2>&1 || rc=$?
      cp -r docs/bench docs/bench_suite_cuda.md "$RESULTS/docs/" ;;
    build_time)
      for run in first_on_machine warm; do
        python3 scripts/build_time.py distilbert_qa --device cuda --out "$RESULTS/build_time_$run.json" \
          >> "$RESULTS/build_time.log" 2>&1 || rc=$?
      done ;;
    precision) python3 -m pytest -q tests/test_gpu_precision.py -p no:cacheprovider > "$RESULTS/precision.log" 2>&1 || rc=$? ;;
    probes)
      python3 - "$WORK" > "$RESULTS/probes.txt" 2>&1 <<'PY' || rc=$?
import json, sys
from pathlib import Path
for manifest in sorted(Path(sys.argv[1]).rglob("manifest.json")):
    phases = json.loads(manifest.read_text()).get("build_phases", {})
    probe = phases.get("aotc.cpu_isa_probe", {})
    print(manifest.parent, probe.get("calls", "-"), probe.get("seconds", "-"))
PY
      ;;
    generate_tests) python3 -m pytest -q -s tests/test_gpu_generate.py tests/test_gpu_sampling.py -p no:cacheprovider > "$RESULTS/generate_tests.log" 2>&1 || rc=$? ;;
    decode_contender)
      python3 scripts/generate_bench.py --llama-1b --qwen3-0.6b --device cuda --precision bf16 --contenders aotc,gpt-fast \
        --prompt-tokens 32 --new 288 --max-seq-len 1024 --rounds 3 --bandwidth \
        --out "$RESULTS/decode_contender.json" >> "$RESULTS/decode_contender.log" 2>&1 || rc=$?
      python3 scripts/generate_bench.py --gpt2-124m --device cuda --precision bf16 --contenders aotc \
        --prompt-tokens 32 --new 128 --rounds 5 --bandwidth \
        --out "$RESULTS/decode_gpt2.json" >> "$RESULTS/decode_contender.log" 2>&1 || rc=$? ;;
    engine_load)
      gpt2_file
      { python3 -m aotc export "$WORK/gpt2_124m.py" --task text-generation --max-seq-len 768 --batch-size 32 \
          -o "$WORK/gpt2_engine.pt2" --force &&
        python3 -m aotc build "$WORK/gpt2_engine.pt2" --device cuda --mode reduce-overhead --precision bf16 \
          -o "$WORK/gpt2_engine_pkg" --force --quiet &&
        python3 scripts/engine_load.py "$WORK/gpt2_engine_pkg" --streams 1,32 --requests 8 \
          --prefill-chunks 256,64 --out "$RESULTS/engine_load.json"; } > "$RESULTS/engine_load.log" 2>&1 || rc=$? ;;
    quantize)
      python3 -m pytest -m gpu tests/test_gpu_quantize.py -q -p no:cacheprovider > "$RESULTS/quantize_tests.log" 2>&1 || rc=$?
      python3 scripts/generate_bench.py --llama-1b --device cuda --precision bf16 --contenders aotc \
        --quantize none,int8-weight-only,int4-weight-only,fp8 --prompt-tokens 32 --new 288 --max-seq-len 1024 \
        --rounds 3 --bandwidth --out "$RESULTS/quantize_llama.json" > "$RESULTS/quantize_bench.log" 2>&1 || rc=$? ;;
    quantize_bench)
      python3 scripts/generate_bench.py --llama-1b --device cuda --precision bf16 --contenders aotc \
        --quantize none,int8-weight-only,int4-weight-only,fp8 --prompt-tokens 32 --new 288 --max-seq-len 1024 \
        --rounds 3 --bandwidth --out "$RESULTS/quantize_llama.json" > "$RESULTS/quantize_bench.log" 2>&1 || rc=$? ;;
    quantize_profile)
      python3 -c "import sys; sys.path.insert(0, 'scripts'); import generate_bench as g; open(sys.argv[1], 'w').write(g.LLAMA_1B)" \
        "$WORK/llama_1b.py"
      python3 -m aotc export "$WORK/llama_1b.py" --task text-generation --max-seq-len 1024 --force \
        -o "$WORK/llama_1b.pt2" > "$RESULTS/quantize_profile.log" 2>&1 || rc=$?
      build_args=(--device cuda --mode reduce-overhead --precision bf16 --force --quiet)
      python3 -m aotc build "$WORK/llama_1b.pt2" "${build_args[@]}" --quantize int8-weight-only \
        -o "$WORK/llama_int8_pkg" >> "$RESULTS/quantize_profile.log" 2>&1 &
      python3 -m aotc build "$WORK/llama_1b.pt2" "${build_args[@]}" -o "$WORK/llama_bf16_pkg" \
        >> "$RESULTS/quantize_profile.log" 2>&1 || rc=$?
      wait $! || rc=$?
      log "quantize_profile built rc=$rc"
      python3 scripts/decode_profile.py "$WORK/llama_bf16_pkg" "$WORK/llama_int8_pkg" --prompt-tokens 32 \
        --json "$RESULTS/decode_profile_int8.json" >> "$RESULTS/quantize_profile.log" 2>&1 || rc=$? ;;
    quantize_tests)
      python3 -m pytest -m gpu tests/test_gpu_quantize.py -q -p no:cacheprovider > "$RESULTS/quantize_tests.log" 2>&1 || rc=$? ;;
    step_cost)
      python3 scripts/step_cost.py --device cuda --lengths 256,4096 --context 64 --batch 4 \
        --out "$RESULTS/step_cost_cuda.json" > "$RESULTS/step_cost.log" 2>&1 || rc=$? ;;
    generate_bench)
      python3 scripts/generate_bench.py --gpt2-124m --device cuda --precision bf16,fp32 --prompt-tokens 32 \
        --new 128 --rounds 5 --bandwidth --out "$RESULTS/generate_gpt2.json" >> "$RESULTS/generate_bench.log" 2>&1 || rc=$?
      python3 scripts/generate_bench.py --llama-1b --device cuda --precision bf16 --contenders aotc,eager \
        --prompt-tokens 512 --new 128 --max-seq-len 1024 --rounds 3 --bandwidth \
        --out "$RESULTS/generate_llama1b.json" >> "$RESULTS/generate_bench.log" 2>&1 || rc=$? ;;
    zoo_bf16|zoo_bf16=*)
      names=(roberta_base_seqcls llama_120m vit_base_hf t5_small distilbert_qa)
      [ "$step" != zoo_bf16 ] && IFS=, read -r -a names <<< "${step#zoo_bf16=}"
      python3 scripts/zoo.py --device cuda --only "${names[@]}" --mode reduce-overhead --precision bf16 \
        --jobs 5 --iters 100 --work "$WORK/zoo_bf16" --merge > "$RESULTS/zoo_bf16.log" 2>&1 || rc=$?
      cp docs/models.md docs/models.json "$RESULTS/docs/" ;;
    zoo_probe|zoo_probe=*)
      chosen=(--set gpu)
      names=${step#zoo_probe=}
      [ "$step" != zoo_probe ] && chosen=(--only ${names//,/ })
      python3 scripts/zoo.py --device cuda "${chosen[@]}" --mode reduce-overhead --jobs 4 --iters 20 --no-compile \
        --work "$WORK/zoo_probe" --out "$RESULTS/zoo_probe.md" > "$RESULTS/zoo_probe.log" 2>&1 || rc=$? ;;
    generate_llama)
      python3 scripts/generate_bench.py --llama-1b --device cuda --precision bf16 --contenders aotc,eager \
        --prompt-tokens 512 --new 128 --max-seq-len 1024 --rounds 3 --bandwidth \
        --out "$RESULTS/generate_llama1b.json" >> "$RESULTS/generate_bench.log" 2>&1 || rc=$? ;;
    serve_load)
      gpt2_file
      # a cache several requests long: continuous batching joins a request only while the cache's
      # columns left hold it beside the running ones (aotc_runtime/continuous.py)
      { python3 -m aotc export "$WORK/gpt2_124m.py" --task text-generation --max-seq-len 512 --batch-size 32 \
          -o "$WORK/gpt2_serve.pt2" --force &&
        python3 -m aotc build "$WORK/gpt2_serve.pt2" --device cuda --mode reduce-overhead --precision bf16 \
          -o "$WORK/gpt2_serve_pkg" --force --quiet; } > "$RESULTS/serve_load.log" 2>&1 || rc=$?
      python3 -m aotc serve "$WORK/gpt2_serve_pkg" --port 8123 >> "$RESULTS/serve_load.log" 2>&1 &
      server=$!
      for _ in $(seq 120); do curl -sf localhost:8123/v1/health > /dev/null && break; sleep 2; done
      python3 scripts/completions_load.py http://127.0.0.1:8123 --streams 1,8,32 --requests 4 --max-tokens 96 \
        --timeout 30 --baseline "$WORK/gpt2_serve_pkg" --out "$RESULTS/completions_load_h100.json" \
        >> "$RESULTS/serve_load.log" 2>&1 || rc=$?
      curl -s localhost:8123/v1/health > "$RESULTS/serve_health.json"
      # SIGTERM, which aotc takes as Ctrl-C (a script's background job ignores SIGINT itself: the
      # -INT sent here until 2026-11-26 left the server running); Ray stopped by force after 30 s
      kill -TERM $server
      for _ in $(seq 30); do kill -0 $server 2> /dev/null || break; sleep 1; done
      kill -0 $server 2> /dev/null && { log "aotc serve still running 30 s after SIGTERM"; kill -KILL $server; ray stop --force > /dev/null 2>&1; }
      # the replica's own log (a failure inside it is written there, not to the server's output)
      tar -czf "$RESULTS/ray_logs.tgz" -C /tmp/ray/session_latest logs 2> /dev/null ;;
    generate_gpt2)
      python3 scripts/generate_bench.py --gpt2-124m --device cuda --precision bf16 --prompt-tokens 32 \
        --new 128 --rounds 5 --bandwidth --out "$RESULTS/generate_gpt2.json" >> "$RESULTS/generate_bench.log" 2>&1 || rc=$? ;;
    decode_ab)
      python3 -c "import sys; sys.path.insert(0, 'scripts'); import generate_bench as g; open(sys.argv[1], 'w').write(g.LLAMA_1B)" \
        "$WORK/llama_1b.py"
      export_args=(export "$WORK/llama_1b.py" --task text-generation --max-seq-len 1024 --force)
      # the model's own projections, unstacked: the stacking switched off in this process
      python3 -c "import aotc.export.text_generation as t; t.fuse_sibling_linears = lambda model, run: 0; from aotc.cli.main import main; main()" \
        "${export_args[@]}" -o "$WORK/llama_unstacked.pt2" > "$RESULTS/decode_ab.log" 2>&1 &
      python3 -m aotc "${export_args[@]}" -o "$WORK/llama_stacked.pt2" >> "$RESULTS/decode_ab.log" 2>&1 || rc=$?
      wait $! || rc=$?
      build_args=(--device cuda --mode reduce-overhead --precision bf16 --force --quiet)
      python3 -m aotc build "$WORK/llama_unstacked.pt2" "${build_args[@]}" -o "$WORK/llama_unstacked_pkg" >> "$RESULTS/decode_ab.log" 2>&1 &
      python3 -m aotc build "$WORK/llama_stacked.pt2" "${build_args[@]}" -o "$WORK/llama_stacked_pkg" >> "$RESULTS/decode_ab.log" 2>&1 || rc=$?
      wait $! || rc=$?
      log "decode_ab built rc=$rc"
      pkgs=("$WORK/llama_stacked_pkg" "$WORK/llama_unstacked_pkg")
      python3 scripts/decode_profile.py "${pkgs[@]}" --json "$RESULTS/decode_profile_llama1b.json" \
        >> "$RESULTS/decode_ab.log" 2>&1 || rc=$?
      python3 scripts/generate_bench.py --llama-1b --device cuda --contenders aotc,eager --prompt-tokens 512 \
        --new 128 --max-seq-len 1024 --rounds 3 --bandwidth --built "$(IFS=,; echo "${pkgs[*]}")" \
        --out "$RESULTS/generate_llama1b_ab.json" >> "$RESULTS/decode_ab.log" 2>&1 || rc=$? ;;
    cpp_generate)
      gpt2_file
      prompt=$(python3 -c "print(','.join(str((i * 7919) % 50000) for i in range(32)))")
      { python3 -m aotc export "$WORK/gpt2_124m.py" --task text-generation --max-seq-len 256 -o "$WORK/gpt2_b1.pt2" --force &&
        python3 -m aotc build "$WORK/gpt2_b1.pt2" --device cuda --mode reduce-overhead --precision bf16 \
          -o "$WORK/gpt2_b1_pkg" --force --quiet &&
        python3 -m aotc.deploy.cpp_runner build "$WORK/runner_build" &&
        python3 scripts/generate_cold_start.py "$WORK/gpt2_b1_pkg" --runner "$WORK/runner_build/aotc-runner" \
          --runs 7 --out "$RESULTS/cold_start_generate_h100.json"; } > "$RESULTS/cpp_generate.log" 2>&1 || rc=$?
      for round in 1 2 3; do
        "$WORK/runner_build/aotc-runner" "$WORK/gpt2_b1_pkg" --generate --prompt-ids "$prompt" \
          --max-new-tokens 128 --json >> "$RESULTS/runner_generate_h100.jsonl" 2>> "$RESULTS/cpp_generate.log" || rc=$?
        python3 -m aotc generate "$WORK/gpt2_b1_pkg" --prompt-ids "$prompt" --max-new-tokens 128 --json \
          >> "$RESULTS/python_generate_h100.jsonl" 2>> "$RESULTS/cpp_generate.log" || rc=$?
      done
      # a CUDA bundle of it, generating with an empty environment; its size
      AOTC_RUNNER="$WORK/runner_build/aotc-runner" python3 -m aotc bundle "$WORK/gpt2_b1_pkg" \
        -o "$WORK/gpt2_b1_bundle" --force --json > "$RESULTS/bundle_h100.json" 2>> "$RESULTS/cpp_generate.log" || rc=$?
      env -i "$WORK/gpt2_b1_bundle/run" --generate --prompt-ids "$prompt" --max-new-tokens 128 --json \
        > "$RESULTS/bundle_generate_h100.json" 2>> "$RESULTS/cpp_generate.log" || rc=$?
      { du -sb "$WORK/gpt2_b1_bundle" "$WORK/gpt2_b1_bundle/lib"; ls "$WORK/gpt2_b1_bundle/lib"; } \
        > "$RESULTS/bundle_h100.txt" 2>&1 ;;
    tests=*) python3 -m pytest -q -m gpu tests -k "${step#tests=}" -p no:cacheprovider > "$RESULTS/tests_k.log" 2>&1 || rc=$? ;;
    *) log "unknown step $step"; rc=2 ;;
  esac
  log "end $step rc=$rc"
done
log "done"
touch "$RESULTS/DONE"
