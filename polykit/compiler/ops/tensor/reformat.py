"""ai.polykit Reformat: a channels-last chain's entry or exit in one copy.

Reformat(x) -> y, x of rank 4 and a float dtype. Attributes (ints):

- `perm`: (0, 2, 3, 1) (NCHW -> NHWC) or (0, 3, 1, 2) (NHWC -> NCHW);
- `to` (optional, default x's dtype): the output's TensorProto.DataType, a float type (float16,
  float32, bfloat16): the values are converted as Cast converts them;
- `pad` (optional, default 0; (0, 2, 3, 1) only): zeros appended at the end of the output's last
  (channel) axis.

    y = Pad(Transpose(Cast(x, to), perm), [0, 0, 0, 0, 0, 0, 0, pad])

A model's image input (Cast fp32 -> fp16, Transpose to NHWC, Pad of 3 channels to 8) and its
segmentation output (Transpose to NCHW, Cast to float32) are one pass over the bytes.
polykit.compiler.passes.channel_movement.compose_reformats makes it, only where the transposed
channels number at most MAX_CHANNELS (a pixel's channels are one thread's loop); docs/FUSION.md.
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir import dtypes
from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.registry import InferContext, shape_rule

REFORMAT = "Reformat"
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
#: most channels (the packed side's last axis) compose_reformats composes over
MAX_CHANNELS = 64
FLOATS = ("float16", "float32", "bfloat16")
_HINT = "compose_reformats makes this node; rebuild the plan (or fix the edited attributes)"


def reformat_attrs(node: Node, in_dtype: np.dtype | None) -> tuple[tuple[int, ...], np.dtype | None, int]:
    """(perm, output dtype, pad) of a Reformat node (ValueError naming what is wrong)."""
    perm = tuple(int(p) for p in node.attrs.get("perm", ()))
    if perm not in (TO_NHWC, TO_NCHW):
        raise ValueError(f"perm {list(perm)} is neither {list(TO_NHWC)} nor {list(TO_NCHW)}")
    to = dtypes.to_numpy(int(node.attrs["to"]), where=node.describe()) if "to" in node.attrs else in_dtype
    pad = int(node.attrs.get("pad", 0))
    if pad < 0 or (pad and perm != TO_NHWC):
        raise ValueError(f"pad {pad} must be >= 0, and 0 unless perm is {list(TO_NHWC)}")
    for dt in (in_dtype, to):
        if dt is not None and dtypes.dtype_name(dt) not in FLOATS:
            raise ValueError(f"dtype {dtypes.dtype_name(dt)} is not one of {', '.join(FLOATS)}")
    return perm, to, pad


@shape_rule(REFORMAT, domain=POLYKIT_DOMAIN)
def _reformat(ctx: InferContext):
    if ctx.n_inputs != 1 or not ctx.has(0) or ctx.n_outputs != 1:
        raise ctx.fail("Reformat takes one tensor and gives one", hint=_HINT)
    if ctx.rank(0) not in (None, 4):
        raise ctx.fail(f"Reformat reads a rank-4 tensor, not rank {ctx.rank(0)}", hint=_HINT)
    try:
        perm, to, pad = reformat_attrs(ctx.node, ctx.dtype(0))
    except ValueError as exc:
        raise ctx.fail(str(exc), hint=_HINT) from None
    shape = ctx.shape(0)
    if shape is None:
        return [(to, None)]
    out = [shape[p] for p in perm]
    if pad:
        if not isinstance(out[3], int):
            return [(to, None)]
        out[3] += pad
    return [(to, tuple(out))]
