"""BERT-base's feed-forward block alone, FP8 or fp16, its first GEMM's tactic forced: each tactic's FFN1 time, and what
ncu profiles.

    PYTHONPATH=. python3 benchmarks/fp8_gemm_one.py --tactics cuda.fp8.gemm_fast_sm90_128x192,cuda.fp8.gemm_sm90_128x192
    PYTHONPATH=. python3 benchmarks/fp8_gemm_one.py --fp16 --tactics cuda.gemm.sm90_128x192
    PYTHONPATH=. ncu --set full --kernel-name regex:gemm_sm90 --launch-skip 2 --launch-count 1 \
        python3 benchmarks/fp8_gemm_one.py --tactics cuda.fp8.gemm_fast_sm90_128x192 --runs 3

The model (`ffn_block`): x [M, 768] -> FFN1 (MatMul 768 -> 3072, + bias, Gelu) -> FFN2 (MatMul 3072 -> 768, + bias)
-> y, weights random (seeded), M = batch * sequence (8 x 128 = 1024: BERT-base bs8 s128's rows). The FP8 form is
what benchmarks/fp8_bert.py builds: explicit FP8 Q/DQ around both GEMMs (polykit.tools.model.fp8_qdq, calibrated on
the cpu target), built --fp16, so FFN1 is a QConvNHWC with bias (fold_qdq.leading_bias), Gelu and an e4m3 output
(FFN2 reads e4m3), as in BERT's plan, where the twenty-second session's profile put it at 24.4 us on
`cuda.fp8.gemm_sm90_128x192` against fp16's 16.9 on `cuda.gemm.sm90_128x192` (H100). `--fp16` builds the float
model --fp16 (FFN1 the fp16 GEMM with its bias and Gelu in the epilogue).

Each tactic of --tactics is forced on FFN1 (`tactic_replay`, level 0: nothing else timed); the plan runs --runs
profiled times (`profile_engine`: CUDA events around each layer) and prints every layer's median with its tactic.
Under ncu a run launches the quantize of x, FFN1 and FFN2 (at level 0 the FP8 FFN2 takes fp8_sm90's conv tiles,
kernel conv_sm90, so `regex:gemm_sm90` sees FFN1 alone, once a run), after one unprofiled run.
"""

from __future__ import annotations

import argparse

import numpy as np

HIDDEN, INNER = 768, 3072


def ffn_block(rows: int, hidden: int = HIDDEN, inner: int = INNER, seed: int = 0, act: str = "gelu"):
    """x [rows, hidden] -> MatMul (W1 [hidden, inner]) + b1 -> Gelu -> MatMul (W2 [inner, hidden]) + b2 -> y: an ONNX
    ModelProto (opset 20: Gelu; FP8 Q/DQ needs >= 19), weights ~ BERT's init scale, FFN1 named `ffn1`; `act` "relu"
    or "none" puts Relu or nothing in Gelu's place (what FFN1's epilogue costs, beside the same GEMM)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def init(name, *shape, scale=0.02):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="ffn1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="ffn1_bias"),
             *([helper.make_node(act.capitalize(), ["hb"], ["g"], name=act)] if act != "none" else []),
             helper.make_node("MatMul", ["g" if act != "none" else "hb", "w2"], ["o"], name="ffn2"),
             helper.make_node("Add", ["o", "b2"], ["y"], name="ffn2_bias")]
    graph = helper.make_graph(nodes, "ffn_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, hidden])],
                              [init("w1", hidden, inner), init("b1", inner), init("w2", inner, hidden),
                               init("b2", hidden)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def fp8_block(rows: int, seed: int = 0, act: str = "gelu"):
    """ffn_block with explicit FP8 Q/DQ around both GEMMs, calibrated on the cpu target on 2 random batches."""
    from polykit.tools.model.fp8_qdq import calibrate_fp8, insert_fp8_qdq

    model = ffn_block(rows, seed=seed, act=act)
    rng = np.random.default_rng(seed + 1)
    data = [{"x": rng.standard_normal((rows, HIDDEN)).astype(np.float32)} for _ in range(2)]
    return insert_fp8_qdq(model, calibrate_fp8(model, data, input_shapes={"x": (rows, HIDDEN)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024, help="M: batch x sequence (BERT-base bs8 s128: 1024)")
    parser.add_argument("--fp16", action="store_true", help="the float model built --fp16 instead of the FP8 one")
    parser.add_argument("--tactics", required=True, help="comma-separated tactics forced on FFN1 (layer `ffn1`)")
    parser.add_argument("--runs", type=int, default=20, help="profiled runs (each layer's median is printed)")
    parser.add_argument("--target", default="cuda", choices=("cuda", "cpu"), help="cpu: a check without a GPU")
    parser.add_argument("--act", default="gelu", choices=("gelu", "relu", "none"),
                        help="FFN1's activation (BERT's Gelu; relu / none: what the Gelu costs in its epilogue)")
    args = parser.parse_args()

    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.errors import BuildError
    from polykit.runtime.engine import Engine
    from polykit.tools.bench.benchmark import profile_engine

    model = ffn_block(args.rows, act=args.act) if args.fp16 else fp8_block(args.rows, act=args.act)
    x = np.random.default_rng(7).standard_normal((args.rows, HIDDEN)).astype(np.float32)
    for tactic in args.tactics.split(","):
        plan = build_plan(model, BuilderConfig(target=args.target, fp16=True, builder_optimization_level=0,
                                               tactic_replay={"ffn1": tactic}))
        if plan.metadata["tactics"].get("ffn1") != tactic:
            raise BuildError(f"FFN1 runs {plan.metadata['tactics'].get('ffn1')!r}, not the forced {tactic!r}",
                             where="layer 'ffn1'", hint="name a tactic of FFN1's kind and precision that this "
                             "target runs (polykit debug tactics lists them)")
        summary = profile_engine(Engine(plan), {"x": x}, args.runs)
        print(f"{tactic}: M={args.rows} {'fp16' if args.fp16 else 'FP8'} act={args.act}", flush=True)
        for layer in summary.layers:
            print(f"  {layer.name[:60]:60s} {layer.tactic:44s} {layer.ms * 1e3:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
