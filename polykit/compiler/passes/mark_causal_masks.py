"""Attention masks known to be causal: the `mask_causal` hint (ai.polykit Attention), for the flash
kernels to skip the key tiles past each query block's diagonal (issue 30: causal attention without
the wasted half of its work).

Decoder exports compute their mask at run time from a constant causal pattern and the caller's
padding mask, e.g. GPT-2's and LLaMA's (HF, TorchScript export):

    keep = And(causal [1, 1, S, S] (a constant after folding), padding [B, 1, 1, S] (from the input))
    mask = Where(keep, 0, -inf)          -> Attention(Q, K, V, mask)

Such a mask is -inf (or false) at every key k > q + c for the constant's c, whatever the padding:
the layer gets attrs["mask_causal"] = c. The mask stays an input and is still applied; the hint only
says where it is certainly masked, so a kernel that skips those keys computes exactly what reading
them would (their probabilities are exp(-inf) = 0, and a row with no key left is undefined either
way), and every other kernel may ignore it. One difference, as with a causal flag in torch's SDPA: a
NaN or infinite score at a skipped key (NaN in K past the diagonal) no longer makes its row NaN
through an additive mask (NaN + -inf); a bool mask discards such scores either way.

What is recognized, from the mask back (depth-limited), never from names:
  additive masks: a constant (masked where -inf); Where(keep, x, y) with y a constant of -inf only
                  (masked at least where keep is false); Cast between float types, Expand, Identity;
  keep masks:     a bool constant (masked where false); And(a, b) (masked where either is: the
                  tightest c of those known); Cast to bool of a bool, Expand, Identity.
A constant's c is the largest k - q over its kept entries (q counted from 0 along a broadcast query
axis, which is valid for every row); none when a key axis of 1 broadcasts, when nothing is kept, or
when c leaves no key to skip. Finite "large negative" masks (-1e4, float32's lowest, which the float16
conversion saturates to -65504) are not -inf and are not taken: a row whose keys are all masked
softmaxes over them, and skipping keys would change that row. Runs after precision conversion (the
mask's own values then) and before fuse_pointwise (which merges the Where and And).
"""

from __future__ import annotations

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.nn.fused import MASK_CAUSAL
from polykit.compiler.passes.rewrite import const

MAX_DEPTH = 8
PASS_THROUGH = ("Expand", "Identity")


def causal_offset_of(kept: np.ndarray) -> int | None:
    """c for a keep-mask array ([.., Sq, Sk], broadcast dims of 1): every kept entry has k <= q + c;
    None when that holds for no c that leaves a key to skip."""
    kept = np.asarray(kept, bool)
    if kept.ndim < 2:
        kept = kept.reshape(1, -1)
    kept = kept.reshape(-1, *kept.shape[-2:]).any(axis=0)
    sq, sk = kept.shape
    if sk < 2 or not kept.any():
        return None
    q = np.arange(sq)[:, None] if sq > 1 else np.zeros((1, 1), np.int64)
    offset = int((np.arange(sk)[None, :] - q)[np.broadcast_to(kept, (sq, sk))].max())
    return offset if offset < sk - 1 else None


def _keep_offset(graph: Graph, name: str, producers: dict[str, Node], depth: int) -> int | None:
    value = const(graph, name)
    if value is not None:
        return causal_offset_of(value) if value.dtype == np.bool_ else None
    node = producers.get(name)
    if node is None or node.domain or depth > MAX_DEPTH:
        return None
    if node.op_type == "And":
        found = [_keep_offset(graph, i, producers, depth + 1) for i in node.inputs if i]
        known = [c for c in found if c is not None]
        return min(known) if known else None
    if node.op_type in PASS_THROUGH or (node.op_type == "Cast" and _is_bool(graph, node.input(0))):
        return _keep_offset(graph, node.input(0), producers, depth + 1)
    return None


def _additive_offset(graph: Graph, name: str, producers: dict[str, Node], depth: int) -> int | None:
    value = const(graph, name)
    if value is not None:
        return causal_offset_of(~np.isneginf(value)) if value.dtype.kind == "f" else None
    node = producers.get(name)
    if node is None or node.domain or depth > MAX_DEPTH:
        return None
    if node.op_type == "Where" and len(node.inputs) == 3:
        fill = const(graph, node.input(2))
        if fill is not None and fill.dtype.kind == "f" and fill.size and np.isneginf(fill).all():
            return _keep_offset(graph, node.input(0), producers, depth + 1)
        return None
    if node.op_type in PASS_THROUGH or (node.op_type == "Cast" and _is_float(graph, node.input(0))
                                        and _is_float(graph, node.outputs[0])):  # -inf stays -inf
        return _additive_offset(graph, node.input(0), producers, depth + 1)
    return None


def _dtype(graph: Graph, name: str):
    value = const(graph, name)
    if value is not None:
        return value.dtype
    info = graph.value(name)
    return None if info is None else info.dtype


def _is_bool(graph: Graph, name: str) -> bool:
    dtype = _dtype(graph, name)
    return dtype is not None and np.dtype(dtype) == np.bool_


def _is_float(graph: Graph, name: str) -> bool:
    dtype = _dtype(graph, name)
    return dtype is not None and np.dtype(dtype).kind == "f"


def mask_causal_offset(graph: Graph, mask: str, producers: dict[str, Node] | None = None) -> int | None:
    """The `mask_causal` hint of an Attention mask tensor (module docstring), or None."""
    producers = producers if producers is not None else graph.producers()
    if _is_bool(graph, mask):
        return _keep_offset(graph, mask, producers, 0)
    if _is_float(graph, mask):
        return _additive_offset(graph, mask, producers, 0)
    return None


def mark_causal_masks(graph: Graph, *, keep: frozenset[str] = frozenset()) -> bool:
    """Set `mask_causal` on every ai.polykit Attention whose mask is causal; True if any changed."""
    producers = graph.producers()
    changed = False
    for node in graph.nodes:
        if node.op_type != "Attention" or node.domain != POLYKIT_DOMAIN or len(node.inputs) < 4 or not node.input(3):
            continue
        offset = mask_causal_offset(graph, node.input(3), producers)
        if offset is not None and node.attrs.get(MASK_CAUSAL) != offset:
            node.attrs[MASK_CAUSAL] = offset
            changed = True
    return changed
