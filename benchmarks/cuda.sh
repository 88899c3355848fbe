#!/usr/bin/env bash
# The measurements that need a GPU, in one go (minutes on one GPU), each step bounded in time
# so that one failing does not stop the rest:
#   - kvrank bench --profile production --device "$device", in fp32 and in bf16 (C = 50, 100, 200);
#   - kvrank bench --profile quick --device "$device" (its trained model: INT8 AUC, drift);
#   - a production-size artifact served by kvrank serve on the GPU and on the CPU side by side
#     (benchmarks/bench_serving_device.py), fp32 and bf16: equal scores, miss and L1-hit latency,
#     and the L1 hit by each protocol (JSON, JSON by reference, v2 HTTP binary, v2 gRPC);
#   - the highest rate of production-size L1 hits (by reference) and of misses one pod answers
#     with client p99 within 14 ms and within 5 ms, open loop, bf16, C = 100, with the GPU's
#     utilisation (benchmarks/bench_rate.py; with DEVICE=cpu, 16 users at a few requests a second);
#   - scoring passes replayed from CUDA graphs against the same passes eager
#     (benchmarks/bench_graphs.py: production size, fp32 and bf16, 1/8/32 users, C = 50/100/200;
#     with DEVICE=cpu the tiny model's bucketed passes, eager), and the rate search again with
#     the server's cuda_graphs on (a GPU only);
#   - kvrank check-model --device "$device" on a trained quick artifact (the load-time checks, on
#     the GPU).
# Usage: benchmarks/cuda.sh OUT_DIR   (PYTHON: the interpreter with kvrank importable;
# DEVICE=cpu walks the same steps without a GPU, to try the script)
# Writes OUT_DIR/*.json and OUT_DIR/cuda.log; prints each step's exit status and time.
set -u
out=${1:?usage: benchmarks/cuda.sh OUT_DIR}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
log="$out/cuda.log"
: >"$log"

step() {
  local name=$1 start rc
  shift
  start=$(date +%s)
  echo "== $name: $*" | tee -a "$log"
  timeout "${STEP_TIMEOUT_S:-240}" "$@" >>"$log" 2>&1
  rc=$?
  echo "== $name: exit $rc in $(($(date +%s) - start)) s" | tee -a "$log"
}

command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$log"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' | tee -a "$log"

for dtype in fp32 bf16; do
  step "bench-production-$dtype" "$py" -m kvrank bench --profile production --device "$device" \
    --compute-dtype "$dtype" --no-l2 --json "$out/bench-production-cuda-$dtype.json"
done
step bench-quick "$py" -m kvrank bench --profile quick --device "$device" --no-l2 \
  --json "$out/bench-quick-cuda.json"
for dtype in fp32 bf16; do
  step "serving-production-$dtype" "$py" "$here/bench_serving_device.py" --size production \
    --compute-dtype "$dtype" --devices "$device",cpu --protocols json,json-ref,v2-http,v2-grpc \
    --json "$out/serving-production-$dtype.json"
done
rate_args=()
[ "$device" = cpu ] && rate_args=(--users 16 --start-rate 2 --miss-start-rate 1 --step-s 3 --refine 1)
STEP_TIMEOUT_S=480 step rate-production-bf16 "$py" "$here/bench_rate.py" --size production \
  --compute-dtype bf16 --device "$device" "${rate_args[@]}" --json "$out/rate-production-bf16.json"
graph_args=(--size production)
[ "$device" = cpu ] && graph_args=(--size tiny --users 1,8 --candidates 100 --repeat 3)
step graphs "$py" "$here/bench_graphs.py" --device "$device" "${graph_args[@]}" \
  --json "$out/graphs.json"
if [ "$device" != cpu ]; then
  STEP_TIMEOUT_S=480 step rate-production-bf16-graphs "$py" "$here/bench_rate.py" \
    --size production --compute-dtype bf16 --device "$device" --cuda-graphs \
    --json "$out/rate-production-bf16-graphs.json"
fi
model=$(mktemp -d)/quick
step train-quick "$py" -m kvrank train --profile quick --steps 60 --out "$model"
step check-model "$py" -m kvrank check-model "$model" --device "$device" \
  --json "$out/check-model-cuda.json"
grep -E '^== .*exit' "$log"
