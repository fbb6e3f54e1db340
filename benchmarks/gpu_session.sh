#!/usr/bin/env bash
# One device call: environment, GPU tests named in $TESTS, then the GEMM benchmark. Logs to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 POLYKIT_CACHE_DIR=/tmp/pkcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, cuda.bindings, cuda.core; print('torch', torch.__version__, 'cuda-core', cuda.core.__version__, 'cuda-bindings', cuda.bindings.__version__)" | tee -a $OUT/env.txt
if [ -n "${TESTS:-}" ]; then
  PYTHONPATH=. timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -n 8 -m gpu -x $TESTS 2>&1 | tail -40 | tee $OUT/tests.txt
fi
if [ -n "${BENCH:-}" ]; then
  PYTHONPATH=. timeout ${BENCH_TIMEOUT:-300} python3 $BENCH 2>&1 | tee $OUT/bench.txt
fi
