set -uo pipefail
export PYTHONUNBUFFERED=1 POLYKIT_CACHE_DIR=/tmp/pkcache
PYTHONPATH=. timeout 200 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider -W ignore tests/kernels/cuda/test_gemm_sm90.py 2>&1 | tail -15 > $OUT/tests.txt
PYTHONPATH=. timeout 200 python3 benchmarks/cuda_gemm.py --shapes square,bert --layouts kn --tactics cuda.gemm.sm90_ --iters 20 --out $OUT/gemm.json > $OUT/gemm.txt 2>&1
PYTHONPATH=. timeout 200 python3 benchmarks/cuda_gemm.py --shapes bert --layouts kn --tactics cuda.gemm.sm90_ --epilogues gelu --iters 20 --out $OUT/gemm_gelu.json > $OUT/gemm_gelu.txt 2>&1
cat $OUT/tests.txt | tail -3
