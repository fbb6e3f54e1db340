"""ai.polykit LayerNormQuantize: LayerNormalization whose output is quantized in its output stage
(fuse_output_quantize makes it from `LayerNormalization -> QuantizeLinear`): an FP8 transformer's
LayerNorm writes the e4m3 activation the next FP8 GEMM reads, instead of a separate QuantizeLinear layer
reading the float output back.

Inputs: X, Scale, B (or ""), Y_scale (float32, one value), Y_zero_point (float8_e4m3fn +0: saturating
e4m3, or int8 / uint8). Attributes `axis`, `epsilon` as LayerNormalization's. Outputs: Yq, the zero
point's type: QuantizeLinear(Y, Y_scale, Y_zero_point) of Y = LayerNormalization(X, Scale, B) in X's
type, exactly as the two ops computed it; and, when the float output has other readers (a residual), Y
itself as a second output.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.quantize_nhwc import OUT_DTYPES
from polykit.compiler.ops.registry import InferContext, shape_rule

KIND = "LayerNormQuantize"
X, SCALE, BIAS, Y_SCALE, Y_ZERO = range(5)


@shape_rule(KIND, domain=POLYKIT_DOMAIN)
def _layernorm_quantize(ctx: InferContext):
    if ctx.n_inputs != 5 or not all(ctx.has(i) for i in (X, SCALE, Y_SCALE, Y_ZERO)) or ctx.n_outputs not in (1, 2):
        raise ctx.fail("LayerNormQuantize takes X, Scale, B (or \"\"), Y_scale and Y_zero_point and gives Yq [, Y]",
                       hint="fuse_output_quantize builds it")
    if ctx.dtype(Y_SCALE) not in (None, np.dtype(np.float32)) or ctx.dtype(Y_ZERO) not in (None, *OUT_DTYPES):
        raise ctx.fail(f"Y_scale {ctx.dtype(Y_SCALE)} / zero point {ctx.dtype(Y_ZERO)}: a float32 scale and an "
                       "int8 / uint8 / float8_e4m3fn zero point", hint="other QuantizeLinear forms stay QuantizeLinear")
    shape = ctx.shape(X)
    if shape is not None:
        ctx.normalize_axis(int(ctx.attr("axis", -1)), len(shape))
    return [(ctx.dtype(Y_ZERO), shape), (ctx.dtype(X), shape)][:ctx.n_outputs]
