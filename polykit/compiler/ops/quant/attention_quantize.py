"""ai.polykit AttentionQuantize: polykit's Attention (docs/FUSION.md) whose output is quantized in its output
stage (fuse_output_quantize makes it from `Attention -> [views] -> QuantizeLinear`): an FP8 transformer's
attention writes the e4m3 activation its output projection reads, instead of a QuantizeLinear layer reading
the float output back.

Inputs: Attention's Q, K, V, mask (or ""), then Y_scale (float32, one value) and Y_zero_point (float8_e4m3fn
+0, saturating; or int8 / uint8). Attributes: Attention's (layouts, views, scale, kv_groups, ...). Output:
QuantizeLinear(O, Y_scale, Y_zero_point) of Attention's output O in Q's type, O's shape, the zero point's type.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.ops.quant.quantize_nhwc import OUT_DTYPES
from polykit.compiler.ops.registry import InferContext, find_shape_rule, shape_rule

KIND = "AttentionQuantize"
#: Attention's inputs (Q, K, V, mask), then the quantization's
ATTENTION_ARITY = 4
Y_SCALE, Y_ZERO = 4, 5


@shape_rule(KIND, domain=POLYKIT_DOMAIN)
def _attention_quantize(ctx: InferContext):
    if ctx.n_inputs != 6 or not all(ctx.has(i) for i in (0, 1, 2, Y_SCALE, Y_ZERO)) or ctx.n_outputs != 1:
        raise ctx.fail("AttentionQuantize takes Q, K, V, mask (or \"\"), Y_scale and Y_zero_point and gives one output",
                       hint="fuse_output_quantize builds it")
    if ctx.dtype(Y_SCALE) not in (None, np.dtype(np.float32)) or ctx.dtype(Y_ZERO) not in (None, *OUT_DTYPES):
        raise ctx.fail(f"Y_scale {ctx.dtype(Y_SCALE)} / zero point {ctx.dtype(Y_ZERO)}: a float32 scale and an "
                       "int8 / uint8 / float8_e4m3fn zero point", hint="other QuantizeLinear forms stay QuantizeLinear")
    ((_, shape),) = find_shape_rule(POLYKIT_DOMAIN, "Attention")(ctx)  # Attention's checks, views and layouts
    return [(ctx.dtype(Y_ZERO), shape)]
