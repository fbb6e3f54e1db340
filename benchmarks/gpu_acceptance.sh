#!/usr/bin/env bash
# Issue-4 acceptance on a GPU machine: ResNet-50 and BERT-base exports through
# `polykit run --trt --onnxrt --target cuda` (fp32 tolerances), logs under ${OUT:-/tmp/out}.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
models=$(mktemp -d)
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 benchmarks/export_models.py "$models" 2>&1 | grep -v -i warn | tee "$out/export.log"
for m in resnet50 bert_base; do
  echo "== polykit run $m.onnx --trt --onnxrt --target cuda" | tee -a "$out/acceptance.log"
  python3 -m polykit.tools.cli.app run "$models/$m.onnx" --trt --onnxrt --target cuda --atol 1e-4 --rtol 1e-3 \
    2>&1 | tee -a "$out/acceptance.log"
  echo "exit code: ${PIPESTATUS[0]}" | tee -a "$out/acceptance.log"
done
