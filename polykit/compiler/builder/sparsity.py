"""2:4 structured sparsity in a build (BuilderConfig.sparsity, trtexec's --sparsity).

Before tactics are chosen, `offer_sparse` finds the eligible layers: Gemm, MatMul and 1x1
Conv / ConvNHWC layers (plain or with an epilogue) whose constant weight has the 2:4 pattern
along the reduction axis (polykit.compiler.plan.sparse24) and whose K is a multiple of the sparse
mma's K step. It lists them in the build log as TensorRT does ("Layers eligible for sparse
math: ..."), stores each weight's compressed form (values + metadata) as a weight of its own
and marks the layer with the offer (OFFER). The tuner then adds, for a marked layer, its sparse
variant (`sparse_variant`: the same layer reading the compressed weight, attrs "sparse24")
after the dense candidates, and times it against them like any tactic; `settle_sparse` drops
the offers and every weight no chosen layer reads. With "force", weights of eligible shape
(their reduction axis a multiple of 4, any Conv kernel) are first pruned by magnitude to the
pattern, with a warning: the results change.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN
from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.compiler.plan.sparse24 import (ATTR, DTYPES, K_STEP, KINDS, blob_bytes, compress, gemm_matrix, has_pattern, prune,
                                      reduction_axis, sparse_record)

log = logging.getLogger("polykit")

#: the attribute of a layer that has a sparse variant (its ATTR record), until settle_sparse
OFFER = "sparse24_offer"
#: the suffix of a compressed weight's name
SUFFIX = "::sparse24"


def _weight_of(layer: LayerDesc, weights: dict[str, np.ndarray]) -> str | None:
    """The name of the layer's GEMM weight (input 1) when it is a float constant."""
    if layer.kind not in KINDS or layer.domain not in ("", POLYKIT_DOMAIN) or len(layer.inputs) < 2:
        return None
    name = layer.inputs[1]
    w = weights.get(name) if name else None
    return name if w is not None and w.dtype.name in DTYPES else None


def offer_sparse(layers: Sequence[LayerDesc], weights: dict[str, np.ndarray], tensors: dict[str, TensorDesc],
                 mode: str, profiles: int = 1) -> tuple[list[LayerDesc], dict[str, np.ndarray], dict[str, TensorDesc]]:
    """(layers with OFFER on the eligible ones, weights and tensors with their compressed forms);
    mode "force" prunes eligible-shaped weights to the pattern first. A build with several
    optimization `profiles` gets no offers (a layer reads one weight form, and each profile picks
    its own tactic), with a warning; force still prunes."""
    weights, tensors = dict(weights), dict(tensors)
    if profiles > 1:
        log.warning("sparse tactics are not offered in a build with %d optimization profiles (each profile "
                    "chooses its own tactic, a layer reads one form of its weight)", profiles)
    pruned: list[str] = []
    out, eligible = [], []
    for layer in layers:
        name = _weight_of(layer, weights)
        axis = reduction_axis(layer.kind, layer.attrs, weights[name].shape) if name else None
        if axis is None or weights[name].shape[axis] % 4:
            out.append(layer)
            continue
        if mode == "force" and not has_pattern(weights[name], axis):
            weights[name] = prune(weights[name], axis)
            pruned.append(name)
        matrix = gemm_matrix(layer.kind, layer.attrs, weights[name])
        if matrix is None or matrix.shape[1] % K_STEP or not has_pattern(matrix) or profiles > 1:
            out.append(layer)
            continue
        blob = name + SUFFIX
        if blob not in weights:
            weights[blob] = compress(matrix)
            tensors[blob] = TensorDesc(blob, "uint8", (int(weights[blob].size),), "weight", -1, int(weights[blob].size))
        record = sparse_record(blob, matrix.shape[0], matrix.shape[1], matrix.dtype, weights[name].shape)
        out.append(replace(layer, attrs={**layer.attrs, OFFER: record}))
        eligible.append(layer.name)
    if pruned:
        log.warning("--sparsity force pruned %d weight(s) to the 2:4 pattern by magnitude (%s): the results change; "
                    "for speed studies only", len(pruned), ", ".join(pruned[:5]) + (", ..." if len(pruned) > 5 else ""))
    log.info("Layers eligible for sparse math: %s", ", ".join(eligible) if eligible else "none")
    return out, weights, tensors


def sparse_variant(layer: LayerDesc) -> LayerDesc | None:
    """The layer reading its weight's compressed form (attrs ATTR), stamped; None without an offer."""
    record = layer.attrs.get(OFFER)
    if record is None:
        return None
    attrs = {k: v for k, v in layer.attrs.items() if k != OFFER}
    inputs = (layer.inputs[0], record["weight"], *layer.inputs[2:])
    nbytes = blob_bytes(record["n"], record["k"], record["dtype"])
    stamped: dict[str, Any] = {}
    if layer.in_dtypes:
        stamped = {"in_dtypes": (layer.in_dtypes[0], "uint8", *layer.in_dtypes[2:]),
                   "in_shapes": (layer.in_shapes[0], (nbytes,), *layer.in_shapes[2:])}
    return replace(layer, inputs=inputs, attrs={**attrs, ATTR: record}, **stamped)


def with_sparse_variants(variants: Sequence[LayerDesc]) -> list[LayerDesc]:
    """`variants` (a layer at each precision), then the sparse variant of each that has one."""
    sparse = [s for s in (sparse_variant(v) for v in variants) if s is not None]
    return list(variants) + sparse


def settle_sparse(layers: Sequence[LayerDesc], weights: dict[str, np.ndarray], tensors: dict[str, TensorDesc]
                  ) -> tuple[list[LayerDesc], dict[str, np.ndarray], dict[str, TensorDesc]]:
    """The chosen layers without offers, and the weights and tensors less the compressed weights
    no layer reads (of layers that stayed dense) and the dense weights no layer reads any more
    (of layers that went sparse)."""
    layers = [replace(l, attrs={k: v for k, v in l.attrs.items() if k != OFFER}) if OFFER in l.attrs else l
              for l in layers]
    read = {n for l in layers for n in l.inputs if n}
    blobs = [n for n in weights if n.endswith(SUFFIX)]
    unread = {n for n in blobs + [b[:-len(SUFFIX)] for b in blobs] if n not in read}
    chosen = [l.name for l in layers if ATTR in l.attrs]
    log.info("Layers with a sparse tactic chosen: %s", ", ".join(chosen) if chosen else "none")
    return (layers, {n: w for n, w in weights.items() if n not in unread},
            {n: t for n, t in tensors.items() if n not in unread})
