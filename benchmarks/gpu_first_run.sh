#!/usr/bin/env bash
# The first device calls of a session after sessions without a GPU (2026-12-04 and -05): the
# CUDA paths written since then have only been compiled with NVRTC and tested in emulation.
# Run with the device tool from the repository root, one STEP per call (each well under 10 min):
#
#   STEP=suite     the whole GPU suite (includes every gpu test written without a GPU: plans that
#                  carry no code, permuted_copy, channels-last fp16 builds, diamond epilogues, refit of
#                  live engines, the runtime API, weight streaming, weight-only GEMM, dynamic shape
#                  chains and data-dependent dims, compatibility, the lean runtime)
#   STEP=serving   issue 31's acceptance (in place vs copies, fp16 I/O, bit identity)
#   STEP=deploy    weight streaming latency at all / half / quarter / none (issue 36), refit on cuda,
#                  the W4A16 GEMM against fp16 (issue 35)
#   STEP=dynamic   issue 33: real exports with dynamic axes on cuda (needs torch on the device)
#
# Logs and JSON go to $OUT. Exit status: the step's.
set -uo pipefail
export PYTHONUNBUFFERED=1 POLYKIT_CACHE_DIR=/tmp/pkcache PYTHONPATH=.
step=${STEP:-suite}
case "$step" in
  suite)
    timeout 560 python3 -m pytest -m gpu -n 15 -q -p no:cacheprovider 2>&1 | tail -60 | tee "$OUT/gpu_suite.txt"
    ;;
  serving)
    timeout 560 python3 benchmarks/serving_api.py --out "$OUT/serving_api.json" 2>&1 | tee "$OUT/serving_api.txt"
    ;;
  deploy)
    mkdir -p /tmp/zoo_onnx
    python3 - <<'EOF'
import torch, torchvision
m = torchvision.models.resnet50(weights=None).eval()
torch.onnx.export(m, torch.randn(1, 3, 224, 224), "/tmp/zoo_onnx/resnet50.onnx", opset_version=17, dynamo=False)
EOF
    timeout 240 python3 benchmarks/weight_streaming.py /tmp/zoo_onnx/resnet50.onnx --target cuda 2>&1 | tee "$OUT/weight_streaming.txt"
    timeout 240 python3 benchmarks/weight_only_gemm.py --out "$OUT/weight_only.json" 2>&1 | tee "$OUT/weight_only.txt"
    ;;
  dynamic)
    timeout 560 python3 benchmarks/dynamic_exports.py all --dir /tmp/dyn --target cuda \
      --models resnet18,efficientnet_b0,deeplabv3_mobilenet_v3_large,swin_t,bert_base,gpt2,ssdlite320_mobilenet_v3_large,fasterrcnn_mobilenet_v3_large_320_fpn \
      --out "$OUT/dynamic_exports" 2>&1 | tail -40 | tee "$OUT/dynamic_exports.txt"
    ;;
  *)
    echo "unknown STEP=$step (suite|serving|deploy|dynamic)"; exit 2 ;;
esac
