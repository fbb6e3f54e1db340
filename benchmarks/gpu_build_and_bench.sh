#!/usr/bin/env bash
# Build times (cold kernel + timing caches, then warm) and `polykit bench` of ResNet-50 fp16
# on the cuda target; logs and JSON under ${OUT:-/tmp/out}. Needs torch + torchvision (export).
#   BATCH=32 bash benchmarks/gpu_build_and_bench.sh
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
work=$(mktemp -d)
export PYTHONPATH=. PYTHONUNBUFFERED=1 POLYKIT_CACHE_DIR="$work/cache"
python3 benchmarks/export_models.py "$work" --batch "${BATCH:-32}" 2>&1 | grep -v -i warn > "$out/export.log"
pk() { python3 -m polykit.tools.cli.app "$@"; }
t0=$(date +%s.%N)
pk convert "$work/resnet50.onnx" -o "$work/cold.plan" --target cuda --fp16 --save-timing-cache "$work/timing.json" 2>&1 | tee "$out/build_cold.log"
t1=$(date +%s.%N)
pk convert "$work/resnet50.onnx" -o "$work/warm.plan" --target cuda --fp16 --load-timing-cache "$work/timing.json" \
  --error-on-timing-cache-miss 2>&1 | tee "$out/build_warm.log"
t2=$(date +%s.%N)
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }
echo "resnet50 bs${BATCH:-32} fp16 convert: cold $(secs $t0 $t1) s (kernel and timing caches empty), warm $(secs $t1 $t2) s (both warm)" | tee "$out/build_times.txt"
cmp "$work/cold.plan" "$work/warm.plan" && echo "cold and warm plans are byte-identical" | tee -a "$out/build_times.txt"
pk bench "$work/warm.plan" --iterations 200 --duration 2 --json > "$out/bench_e2e.json"
pk bench "$work/warm.plan" --iterations 200 --duration 2 --no-data-transfers --json > "$out/bench_compute.json"
pk bench "$work/warm.plan" --iterations 200 --duration 2 --no-data-transfers 2>&1 | tee "$out/bench.txt"
