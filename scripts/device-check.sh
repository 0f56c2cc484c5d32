#!/usr/bin/env bash
# The device check: every GPU test and benchmark of sluice in one command, in phases, so that one
# lent GPU session (15 minutes of device time, start-up included) proves and measures the CUDA path.
#
#   scripts/device-check.sh --pack                 here: pack .device/ (Node + node_modules) and check
#                                                  that the carry fits (64 MiB); build dist/ first
#   scripts/device-check.sh [--out DIR] [--budget SECONDS] [--phases a,b] [--redo a,b] [--dry-run]
#
# On the device (carry .device and dist):  source .device/boot.sh && bash scripts/device-check.sh
#
# Phases, cheapest and most important first; each has its own time cap (DC_CAP_<phase> overrides,
# in seconds), writes DIR/<phase>.json (status passed | failed | timeout | deferred | skipped, the
# seconds it took, its steps) and DIR/<phase>.log, and is skipped when DIR/<phase>.json already says
# passed or failed (a second call finishes what the first did not; --redo runs named phases again):
#   env         the GPU, driver, nvcc, cmake, torch, and where libcublasLt lives (LD_LIBRARY_PATH)
#   build       the native addon, tests and benches for sm_90 only (SLUICE_CUDA_ARCHITECTURES=90-real)
#   tests       ctest's CUDA tests with our GEMM, with cuBLASLt and with issue 32's kernels (flash
#               prefill attention, wide sampler), test/engine-cuda.test.ts and
#               test/pipelined-steps.test.ts,
#               compute-sanitizer memcheck on test_cuda_engine
#   kernels     sluice_cuda_kernel_bench (GEMMs, decode and prefill attention, sampling) beside torch.matmul
#               and torch SDPA (flash) on the 8B shapes
#   engine-small  bench:engine on qwen2.5-0.5b beside transformers
#   vision      bench:vision:encoder --device cuda: the CUDA vision towers (Qwen2.5-VL-3B's, Gemma 3's
#               SigLIP) at three image sizes, one image and four in one pass
#   engine-8b   bench:engine on llama-3.1-8b beside transformers (makes the 16 GB model once; no CPU
#               f32 reference: 32 GB of f32 weights on the host cost a minute, and the 0.5b has one)
#   engine-8b-lt  the same with --cuda-gemm cublaslt (the default, auto, takes cuBLASLt where it loads;
#               engine-8b pins --cuda-gemm native so the two paths stand side by side)
#   engine-8b-fp8  issue 33: the same bf16 8B with --quantization fp8 --kv-cache-dtype fp8 (weights
#               quantized to e4m3 at load, e4m3 KV; --cuda-gemm native as engine-8b; bench/engine-cuda.js
#               directly, as bench/engine.js knows no --kv-cache-dtype), then bench/fp8-ratio.js: batch-1
#               decode FP8 / engine-8b's bf16 (target >= 1.7x) and the KV blocks at start of each
#               (an e4m3 cache: twice the blocks per byte) -> fp8-vs-bf16-llama-3.1-8b.json
#   engine-moe  bench:engine on qwen3-30b-a3b-8l (Qwen3-30B-A3B's layers, 8 of 48) beside transformers:
#               mixture-of-experts decode through the grouped GEMM
#   ts-path     the TypeScript path (Engine) beside sluice_bench at batch 1 and 256, 0.5b and 8B
#   throughput  bench:throughput on the 8B (ShareGPT-like: engine, chat, batch)
#   throughput-fp8  the same with --quantization fp8 --kv-cache-dtype fp8, then bench/fp8-ratio.js against
#               throughput's result: the engine phase's output tokens/s (target >= 1.3x) and the KV blocks
#   poisson     bench:throughput's Poisson arrivals on the 8B at fixed rates
#   serve       bench:serve tiers (asap TTFT under a flex backlog) on the 8B
#   prefix      bench:prefix on the 8B
#   lora        bench:lora --budget on qwen2.5-0.5b: 8 rank-16 adapters against the base model, and the
#               memory budget (issue 36)
# A phase starts only when the remaining --budget holds its minimum; else it is 'deferred'.
# At the end DIR is packed into $OUT/device-check.tar.gz (when $OUT is set) and a summary printed.
#
# --dry-run runs the same phases on the CPU backend with the tiny model and short workloads (no
# GPU phases' kernels, no torch): CI runs it so this script cannot rot between GPU sessions. It
# also checks that what a device call carries stays under 64 MiB. FP8 weights are CUDA-only: the
# dry run's throughput-fp8 runs --kv-cache-dtype fp8 alone (the CPU has an e4m3 KV cache) and its
# ratio against throughput's result; engine-8b-fp8 has no CPU counterpart (test/fp8-ratio.test.ts
# covers its ratio).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

out_dir=/tmp/sluice-device-check
budget=560
phases_wanted=''
redo=''
dry=0
pack=0
while (($#)); do
  case $1 in
    --out) out_dir=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --phases) phases_wanted=$2; shift 2 ;;
    --redo) redo=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --pack) pack=1; shift ;;
    *) echo "device-check: unknown argument $1" >&2; exit 2 ;;
  esac
done

CARRY_LIMIT=$((64 * 1024 * 1024))

# Bytes a device call carries: tracked and untracked-not-ignored files, plus the carried paths.
carry_bytes() {
  local files total=0 p
  total=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
  for p in "$@"; do
    [[ -e $p ]] && total=$((total + $(du -sb "$p" | cut -f1)))
  done
  echo "$total"
}

if ((pack)); then
  # Node and node_modules for a host with neither; test-only clients, the TypeScript compiler and
  # onnxruntime-node (288 MB, no GPU use here) stay behind so the carry fits.
  mkdir -p .device
  grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
  node_bin=$(readlink -f "$(command -v node)")
  [[ -f .device/node.xz && ! $node_bin -nt .device/node.xz ]] || xz -T0 -9 -c "$node_bin" > .device/node.xz
  tar -cJf .device/node_modules.tar.xz --exclude='node_modules/onnxruntime-node' --exclude='node_modules/.cache' \
    --exclude='node_modules/@esbuild' --exclude='node_modules/esbuild' --exclude='node_modules/typescript' \
    --exclude='node_modules/@typescript' --exclude='node_modules/openai' --exclude='node_modules/@anthropic-ai' \
    --exclude='node_modules/vega' --exclude='node_modules/vega-*' --exclude='node_modules/better-sqlite3/deps' \
    --exclude='node_modules/better-sqlite3/src' --exclude='node_modules/better-sqlite3/build/Release/obj*' \
    --exclude='node_modules/lightningcss*' node_modules
  cp scripts/device-boot.sh .device/boot.sh
  [[ -f dist/src/index.js ]] || { echo 'device-check: no dist/ (npm run build:ts first)' >&2; exit 1; }
  bytes=$(carry_bytes .device dist)
  du -sh .device/* dist
  echo "carry: $((bytes / 1048576)) MiB of 64 (working tree + .device + dist)"
  ((bytes <= CARRY_LIMIT)) || { echo 'device-check: the carry is over 64 MiB' >&2; exit 1; }
  echo "run on the device:  source .device/boot.sh && bash scripts/device-check.sh   (carry: .device dist)"
  exit 0
fi

mkdir -p "$out_dir"
started=$(date +%s)
device='cpu (dry run)'
declare -A phase_status
phase_order=()  # the phases in the order run_phase met them, for the summary

elapsed() { echo $(($(date +%s) - started)); }

json_escape() { node -e 'process.stdout.write(JSON.stringify(process.argv[1]))' "$1"; }

# step NAME CAP CMD...: one command of a phase, its output appended to the phase log, its outcome
# (passed / failed / timeout, seconds) collected into the phase's JSON.
step() {
  local name=$1 cap=$2; shift 2
  local t0=$(date +%s) rc status left
  left=$(left_in_phase)
  ((cap > left)) && cap=$left
  echo "== $name (cap ${cap}s): $*" | tee -a "$log"
  timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
  rc=$?
  if ((rc == 0)); then status=passed; elif ((rc == 124 || rc == 137)); then status=timeout; else status=failed; fi
  echo "   -> $status (rc $rc, $(($(date +%s) - t0)) s)" | tee -a "$log"
  steps+=("{\"step\":$(json_escape "$name"),\"status\":\"$status\",\"rc\":$rc,\"seconds\":$(($(date +%s) - t0))}")
  [[ $status == passed ]] || phase_failed=$status
  ran_steps=$((ran_steps + 1))
  return $rc
}

# strict_step NAME CAP CMD...: as step, but on a GPU a test that reports itself skipped (ctest's
# exit 77 'Skipped', vitest's 'skipped', no test found) fails the step: a device that cannot run
# the CUDA tests is a finding, not a pass.
strict_step() {
  local before after
  before=$(wc -l < "$log")
  step "$@" || return
  ((dry)) && return 0
  if tail -n +"$((before + 1))" "$log" | grep -qE '\*\*\*Skipped|Not Run|No tests were found| skipped'; then
    echo "   -> failed: a test was skipped on the GPU" | tee -a "$log"
    steps[-1]=${steps[-1]/\"status\":\"passed\"/\"status\":\"failed\",\"why\":\"skipped on the GPU\"}
    phase_failed=failed
    return 1
  fi
}

# skip_step NAME WHY: a step this run cannot take (recorded, never reported as passed).
skip_step() {
  echo "== $1: skipped ($2)" | tee -a "$log"
  steps+=("{\"step\":$(json_escape "$1"),\"status\":\"skipped\",\"why\":$(json_escape "$2")}")
}

# run_phase NAME MIN_SECONDS CAP_SECONDS FUNCTION
run_phase() {
  local name=$1 min=$2 cap=$3 fn=$4 var="DC_CAP_${1//-/_}"
  cap=${!var:-$cap}
  if [[ -n $phases_wanted && ",$phases_wanted," != *",$name,"* ]]; then return; fi
  phase_order+=("$name")
  local json=$out_dir/$name.json
  if [[ ",$redo," != *",$name,"* && -f $json ]] && grep -qE '"status":"(passed|failed)"' "$json"; then
    phase_status[$name]="$(grep -oE '"status":"[a-z]+"' "$json" | head -1 | cut -d'"' -f4) (earlier call)"
    return
  fi
  local left=$((budget - $(elapsed)))
  if ((left < min)); then
    phase_status[$name]="deferred (${left}s left, needs ${min}s)"
    echo "{\"phase\":\"$name\",\"status\":\"deferred\",\"device\":$(json_escape "$device")}" > "$json"
    return
  fi
  ((cap > left)) && cap=$left
  log=$out_dir/$name.log
  : > "$log"
  steps=()
  ran_steps=0
  phase_failed=''
  phase_deadline=$(($(date +%s) + cap))
  echo "### phase $name (cap ${cap}s, ${left}s of the budget left)"
  local t0=$(date +%s)
  "$fn"
  local status=passed
  ((ran_steps == 0)) && status=skipped
  [[ -n $phase_failed ]] && status=$phase_failed
  local joined
  joined=$(IFS=,; echo "${steps[*]}")
  echo "{\"phase\":\"$name\",\"status\":\"$status\",\"seconds\":$(($(date +%s) - t0)),\"device\":$(json_escape "$device"),\"dryRun\":$((dry ? 1 : 0)),\"steps\":[${joined}]}" > "$json"
  phase_status[$name]=$status
}

# Seconds left of the current phase's cap (at least 1), for its next step.
left_in_phase() { local s=$((phase_deadline - $(date +%s))); ((s < 1)) && s=1; echo "$s"; }

# ---- phases --------------------------------------------------------------------------------------

phase_env() {
  if ((dry)); then
    step 'machine' 10 bash -c 'uname -a; nproc; free -g | head -2; node --version'
    local bytes
    bytes=$(carry_bytes .device dist)
    echo "carry: $((bytes / 1048576)) MiB (working tree + .device + dist; .device $([[ -d .device ]] && echo present || echo 'absent: --pack makes it'))" | tee -a "$log"
    step 'carry under 64 MiB' 5 test "$bytes" -le "$CARRY_LIMIT"
    return
  fi
  step 'nvidia-smi' 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  step 'toolchain' 30 bash -c 'nvcc --version | tail -2; cmake --version | head -1; python3 -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)"'
  # cuBLASLt ships with torch's wheels (nvidia-cublas), not on the loader's path: the engine opens it
  # with dlopen by soname, so its folder goes on LD_LIBRARY_PATH for every later phase.
  local lt
  lt=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site
for base in site.getsitepackages() + ['/usr/local/cuda/lib64', '/usr/lib/x86_64-linux-gnu']:
    for f in sorted(glob.glob(os.path.join(base, '**', 'libcublasLt.so.1[23]*'), recursive=True)):
        print(os.path.dirname(f)); raise SystemExit
EOF
)
  if [[ -n $lt ]]; then
    export LD_LIBRARY_PATH=$lt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "libcublasLt: $lt" | tee -a "$log"
    echo "$lt" > "$out_dir/cublaslt-dir"
  else
    skip_step 'libcublasLt' 'not found: the cuBLASLt steps check nothing'
  fi
}

phase_build() {
  if ((dry)); then
    step 'native build (up to date or rebuilt)' "$(left_in_phase)" node scripts/build-native.js
    return
  fi
  step 'native build for sm_90' "$(left_in_phase)" env SLUICE_CUDA=ON SLUICE_CUDA_ARCHITECTURES=90-real \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" node scripts/build-native.js --force
}

phase_tests() {
  strict_step 'ctest CUDA (our GEMM)' 150 ctest --test-dir build -R '^test_cuda' --output-on-failure
  if [[ -f $out_dir/cublaslt-dir ]] || ((dry)); then
    strict_step 'ctest CUDA engine (cuBLASLt)' 120 env SLUICE_TEST_CUDA_GEMM=cublaslt \
      ctest --test-dir build -R '^test_cuda_(engine|prefix)' --output-on-failure
  else
    skip_step 'ctest CUDA engine (cuBLASLt)' 'no libcublasLt on this host'
  fi
  # Issue 32's kernels (flash prefill attention, the wide sampler) behind their flags: the engine
  # tests again with both on (their kernel tests ran above, in test_cuda).
  strict_step 'ctest CUDA engine (flash attention, wide sampler, mixed-step graphs)' 150 env \
    SLUICE_TEST_CUDA_ATTENTION=flash SLUICE_TEST_CUDA_SAMPLER=wide SLUICE_TEST_CUDA_MIXED_GRAPHS=1 \
    ctest --test-dir build -R '^test_cuda_(engine|prefix)' --output-on-failure
  # vitest's own entry: the device's Node runtime has no npx beside it.
  # (Its 'CUDA unavailable' case is skipped where CUDA works; SLUICE_REQUIRE_CUDA fails a CUDA-less run.)
  step 'vitest engine-cuda' 150 env SLUICE_REQUIRE_CUDA=$((dry ? 0 : 1)) node node_modules/vitest/vitest.mjs run test/engine-cuda.test.ts \
    test/pipelined-steps.test.ts
  if command -v compute-sanitizer >/dev/null && ((!dry)); then
    step 'memcheck test_cuda_engine' "$(left_in_phase)" compute-sanitizer --tool memcheck --error-exitcode 9 \
      --print-limit 20 build/test_cuda_engine
  else
    skip_step 'memcheck test_cuda_engine' 'no compute-sanitizer (or a dry run)'
  fi
}

phase_kernels() {
  if ((dry)); then
    skip_step 'kernel bench and torch.matmul' 'no GPU in a dry run (bench/gemm-vs-torch.ts is unit-tested)'
    return
  fi
  step 'sluice_cuda_kernel_bench llama-3.1-8b' 120 build/sluice_cuda_kernel_bench --shape llama-3.1-8b \
    --json "$out_dir/cuda-kernels-llama-3.1-8b.json"
  step 'torch.matmul llama-3.1-8b' 120 python3 bench/peer_torch_matmul.py --shape llama-3.1-8b \
    --json "$out_dir/torch-matmul-llama-3.1-8b.json"
  step 'torch SDPA prefill llama-3.1-8b' 60 python3 bench/peer_torch_sdpa.py --shape llama-3.1-8b \
    --json "$out_dir/torch-sdpa-llama-3.1-8b.json"
  step 'ours and cuBLASLt against torch' 20 node dist/bench/gemm-vs-torch.js \
    --sluice "$out_dir/cuda-kernels-llama-3.1-8b.json" --torch "$out_dir/torch-matmul-llama-3.1-8b.json" \
    --out "$out_dir/gemm-vs-torch-llama-3.1-8b.json"
  tail -30 "$log" | sed -n '/TFLOP\/s/,$p'
}

phase_engine_small() {
  if ((dry)); then
    step 'bench:engine cpu tiny' "$(left_in_phase)" node dist/bench/engine.js --preset tiny --batch 1,8 --prompt 32 \
      --decode 8 --out "$out_dir/engine-cpu-tiny.json"
    return
  fi
  step 'bench:engine qwen2.5-0.5b + transformers' "$(left_in_phase)" node dist/bench/engine.js --backend cuda \
    --preset qwen2.5-0.5b --peer transformers --cuda-gemm auto --out "$out_dir/engine-cuda-qwen2.5-0.5b.json"
}

phase_engine_8b() {
  ((dry)) && { skip_step 'bench:engine llama-3.1-8b' 'a dry run benches the tiny model once (engine-small)'; return; }
  step 'bench:engine llama-3.1-8b + transformers' "$(left_in_phase)" node dist/bench/engine.js --backend cuda \
    --preset llama-3.1-8b --peer transformers --cuda-gemm native --cpu-reference=false --out "$out_dir/engine-cuda-llama-3.1-8b.json"
}

phase_engine_8b_lt() {
  ((dry)) && { skip_step 'bench:engine llama-3.1-8b cuBLASLt' 'no GPU in a dry run'; return; }
  step 'bench:engine llama-3.1-8b cuBLASLt' "$(left_in_phase)" node dist/bench/engine.js --backend cuda \
    --preset llama-3.1-8b --cuda-gemm cublaslt --cpu-reference=false --out "$out_dir/engine-cuda-llama-3.1-8b-cublaslt.json"
}

# Issue 33's FP8 figures from the bf16 8B bench model (no FP8 checkpoint: its writer would need the 8B
# in f32 first, 32 GB): weights quantized at load, e4m3 KV; the same GEMM path as engine-8b.
phase_engine_8b_fp8() {
  if ((dry)); then
    skip_step 'bench:engine llama-3.1-8b fp8' 'quantization fp8 is CUDA-only; the dry run exercises --kv-cache-dtype fp8 in throughput-fp8'
    return
  fi
  local bf16=$out_dir/engine-cuda-llama-3.1-8b.json fp8=$out_dir/engine-cuda-llama-3.1-8b-fp8.json
  step 'bench:engine llama-3.1-8b fp8 weights, fp8 KV' "$(left_in_phase)" node dist/bench/engine-cuda.js --backend cuda \
    --preset llama-3.1-8b --quantization fp8 --kv-cache-dtype fp8 --cuda-gemm native --cpu-reference=false --out "$fp8" &&
    fp8_ratio engine "$bf16" "$fp8" "$out_dir/fp8-vs-bf16-llama-3.1-8b.json" engine-8b
}

# fp8_ratio MODE BF16_JSON FP8_JSON OUT_JSON BF16_PHASE: bench/fp8-ratio.js on two results of one
# bench, run after the FP8 run's step passed (so FP8_JSON is this call's); the bf16 one comes from an
# earlier phase, maybe of an earlier call, and the step is skipped while it is missing.
fp8_ratio() {
  local mode=$1 bf16=$2 fp8=$3 out=$4 phase=$5
  if [[ ! -f $bf16 ]]; then
    skip_step "fp8 / bf16 ($mode)" "no $(basename "$bf16") (the $phase phase has not run)"
  else
    step "fp8 / bf16 ($mode)" 20 node dist/bench/fp8-ratio.js --mode "$mode" --bf16 "$bf16" --fp8 "$fp8" --out "$out"
    sed -n '/^FP8 \/ bf16/,$p' "$log"
  fi
}

phase_engine_moe() {
  ((dry)) && { skip_step 'bench:engine qwen3-30b-a3b-8l' 'a dry run benches the tiny model once (engine-small)'; return; }
  step 'bench:engine qwen3-30b-a3b-8l + transformers' "$(left_in_phase)" node dist/bench/engine.js --backend cuda \
    --preset qwen3-30b-a3b-8l --peer transformers --cpu-reference=false --out "$out_dir/engine-cuda-qwen3-30b-a3b-8l.json"
}

phase_ts_path() {
  local preset
  if ((dry)); then
    step 'TS path vs sluice_bench cpu tiny' "$(left_in_phase)" node dist/bench/engine.js --path ts --preset tiny \
      --batch 1,8 --decode 8 --kv-gib 0.25 --out "$out_dir/engine-ts-path-cpu-tiny.json"
    return
  fi
  for preset in qwen2.5-0.5b llama-3.1-8b; do
    step "TS path vs sluice_bench $preset" "$(left_in_phase)" node dist/bench/engine.js --path ts --backend cuda \
      --preset "$preset" --batch 1,256 --kv-gib 16 --out "$out_dir/engine-ts-path-$preset.json"
  done
}

phase_throughput() {
  if ((dry)); then
    step 'bench:throughput cpu tiny' "$(left_in_phase)" node dist/bench/throughput.js --preset tiny --requests 24 \
      --length-scale 0.1 --rounds 1 --phases engine,chat,batch --out "$out_dir/throughput-cpu-tiny.json"
    return
  fi
  step 'bench:throughput llama-3.1-8b' "$(left_in_phase)" node dist/bench/throughput.js --backend cuda \
    --preset llama-3.1-8b --phases engine,chat,batch --out "$out_dir/throughput-llama-3.1-8b.json"
}

phase_throughput_fp8() {
  if ((dry)); then
    step 'bench:throughput cpu tiny fp8 KV' "$(left_in_phase)" node dist/bench/throughput.js --preset tiny --requests 24 \
      --length-scale 0.1 --rounds 1 --phases engine,chat,batch --kv-cache-dtype fp8 --out "$out_dir/throughput-cpu-tiny-fp8kv.json" &&
      fp8_ratio throughput "$out_dir/throughput-cpu-tiny.json" "$out_dir/throughput-cpu-tiny-fp8kv.json" \
      "$out_dir/fp8-vs-bf16-throughput-cpu-tiny.json" throughput
    return
  fi
  step 'bench:throughput llama-3.1-8b fp8 weights, fp8 KV' "$(left_in_phase)" node dist/bench/throughput.js --backend cuda \
    --preset llama-3.1-8b --phases engine,chat,batch --quantization fp8 --kv-cache-dtype fp8 \
    --out "$out_dir/throughput-llama-3.1-8b-fp8.json" &&
    fp8_ratio throughput "$out_dir/throughput-llama-3.1-8b.json" "$out_dir/throughput-llama-3.1-8b-fp8.json" \
    "$out_dir/fp8-vs-bf16-throughput-llama-3.1-8b.json" throughput
}

# Poisson arrivals at fixed rates around the offline engine rate (23.7 req/s on an H200 with our GEMM;
# five rates of 1,000 requests did not fit 470 s), 300 requests per rate.
phase_poisson() {
  if ((dry)); then
    step 'bench:throughput poisson cpu tiny' "$(left_in_phase)" node dist/bench/throughput.js --preset tiny \
      --requests 24 --length-scale 0.1 --phases poisson --rates 4,8 --out "$out_dir/poisson-cpu-tiny.json"
    return
  fi
  step 'bench:throughput poisson llama-3.1-8b' "$(left_in_phase)" node dist/bench/throughput.js --backend cuda \
    --preset llama-3.1-8b --phases poisson --rates "${DC_POISSON_RATES:-10,20,30}" --poisson-requests 300 \
    --out "$out_dir/poisson-llama-3.1-8b.json"
}

phase_serve() {
  if ((dry)); then
    step 'bench:serve tiers cpu tiny' "$(left_in_phase)" node dist/bench/serve.js --scenarios tiers --tier-duration 3 \
      --backlog 16 --backlog-output-tokens 16 --settle 1 --drain-timeout 60 --out "$out_dir/serve-cpu-tiny.json"
    return
  fi
  step 'bench:serve tiers llama-3.1-8b' "$(left_in_phase)" node dist/bench/serve.js --backend cuda \
    --preset llama-3.1-8b --scenarios tiers --out "$out_dir/serve-llama-3.1-8b.json"
}

phase_vision() {
  if ((dry)); then
    skip_step 'bench:vision:encoder cuda' 'no GPU in a dry run (the CPU towers have their own bench)'
    return
  fi
  step 'bench:vision:encoder qwen2.5-vl-3b cuda' "$(left_in_phase)" node dist/bench/vision-encoder.js --device cuda \
    --runs 3 --batch 4 --out "$out_dir/vision-encoder-cuda.json"
  step 'bench:vision:encoder gemma-3-4b-vl cuda' "$(left_in_phase)" node dist/bench/vision-encoder.js --device cuda \
    --model gemma-3-4b-vl --sizes 896x896 --runs 3 --batch 4 --out "$out_dir/vision-encoder-gemma3-cuda.json"
}

phase_prefix() {
  if ((dry)); then
    step 'bench:prefix cpu tiny' "$(left_in_phase)" node dist/bench/prefix.js --requests 4 --prefix-tokens 200 \
      --out "$out_dir/prefix-cpu-tiny.json"
    return
  fi
  step 'bench:prefix llama-3.1-8b' "$(left_in_phase)" node dist/bench/prefix.js --backend cuda --preset llama-3.1-8b \
    --out "$out_dir/prefix-llama-3.1-8b.json"
}

phase_lora() {
  if ((dry)); then
    step 'bench:lora cpu tiny' "$(left_in_phase)" node dist/bench/lora.js --preset tiny --dtype f32 --adapters 2 --rank 4 \
      --requests 8 --tokens 4 --budget --out "$out_dir/lora-cpu-tiny.json"
    return
  fi
  step 'bench:lora qwen2.5-0.5b cuda' "$(left_in_phase)" node dist/bench/lora.js --backend cuda --preset qwen2.5-0.5b \
    --budget --out "$out_dir/lora-cuda-qwen2.5-0.5b.json"
}

# ---- run -----------------------------------------------------------------------------------------

if ((!dry)); then
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ -n $device ]] || { echo 'device-check: no GPU (nvidia-smi found none); --dry-run runs on the CPU' >&2; exit 2; }
  # A later call on the same warm machine finds the library folder the env phase found.
  [[ -f $out_dir/cublaslt-dir ]] && export LD_LIBRARY_PATH=$(cat "$out_dir/cublaslt-dir")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
echo "device-check: $device, budget ${budget}s, results in $out_dir"

#         name          min  cap  function
run_phase env            10   60  phase_env
run_phase build          60  300  phase_build
run_phase tests          60  360  phase_tests
run_phase kernels        60  240  phase_kernels
run_phase engine-small   60  240  phase_engine_small
run_phase vision         60  180  phase_vision
run_phase engine-8b     200  420  phase_engine_8b
run_phase engine-8b-lt  100  240  phase_engine_8b_lt
run_phase engine-8b-fp8 120  300  phase_engine_8b_fp8
run_phase engine-moe    150  300  phase_engine_moe
run_phase ts-path       100  240  phase_ts_path
run_phase throughput    200  420  phase_throughput
run_phase throughput-fp8 200 420  phase_throughput_fp8
run_phase poisson       120  300  phase_poisson
run_phase serve         150  300  phase_serve
run_phase prefix        100  240  phase_prefix
run_phase lora           60  180  phase_lora

echo
echo "device-check summary ($device, $(elapsed)s):"
bad=0
for p in "${phase_order[@]}"; do
  [[ -n ${phase_status[$p]:-} ]] || continue
  printf '  %-15s %s\n' "$p" "${phase_status[$p]}"
  [[ ${phase_status[$p]} == failed* || ${phase_status[$p]} == timeout* ]] && bad=1
done
if [[ -n ${OUT:-} ]]; then
  tar -C "$(dirname "$out_dir")" -czf "$OUT/device-check.tar.gz" "$(basename "$out_dir")"
fi
exit $bad
