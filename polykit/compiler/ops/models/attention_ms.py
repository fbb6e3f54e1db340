"""onnxruntime's com.microsoft Attention and MultiHeadAttention, lowered at import.

`onnxruntime.transformers.optimizer.optimize_model` (the usual way BERT / GPT-2 / ViT files are
prepared for serving) fuses each attention block into one of these contrib ops. polykit imports
them as the graph an exporter would have written, with the one ai.polykit `Attention` node that
`recognize_attention` makes of an eager chain (ops/nn/fused.py, docs/FUSION.md):

    Attention:  X @ W + b -> Split(last axis; qkv_hidden_sizes) -> Reshape [B, S, N, h] ->
                Transpose(0, 2, 1, 3) -> ai.polykit Attention(Q, K, V[, mask]) ->
                Transpose(0, 2, 1, 3) -> Reshape [B, S, N*h_v]
    MultiHeadAttention: the same from separate (or packed [B, S, N, 3, h] / [B, L, N, 2, h]) Q, K, V
                (+ their bias slices), K and V also as [B, N, L, h] (BNSH) as given. The form
                follows from the inputs given (no key: packed QKV; a key alone: packed KV), as in
                onnxruntime, so a query behind another contrib op (whose shape import cannot know
                yet) needs no rank; a rank that is known must agree.

Why lower at import rather than give the ops a shape rule, a reference and cuda kernels of their
own: the lowered graph is exactly the form the existing passes already make fast, so one code path
serves both targets -- the MatMul + bias becomes one GEMM with a bias epilogue, `fold_attention_layouts`
turns the Split / Reshape / Transpose chain into strided views of that GEMM's output (as for GPT-2's
`split(E, dim=2)`) and the output transpose into `out_layout` "bshd", and the Attention runs on the
flash kernels. The cpu target runs the same nodes with their reference kernels, which the tests
compare with onnxruntime's own contrib kernels. A second implementation would be a second thing to
keep equal to onnxruntime.

Masks follow onnxruntime: a masked score gets `mask_filter_value` (default -10000) *added*, not -inf
(so a row with every key masked is a softmax of the shifted scores, as onnxruntime gives, not NaN),
while the causal (`unidirectional`) mask adds the lowest float (as onnxruntime's kernels do); the
terms add up. A `unidirectional` node without attention_bias whose mask_filter_value is far from
the float range's end (|value| <= HINT_FILTER_BOUND) also gets the `mask_causal` hint 0 (ops/nn/fused.py):
its keys k > q then score at most lowest + a few filter values, every other key at least a few filter
values, so their probabilities are exactly 0 in float and the flash kernels may skip their tiles
(the hint's contract: what skipping gives is what reading gives). A filter near lowest, or a bias of
any value, could make a row's visible and causal-masked scores equal in float: no hint then. The
mask is built from graph ops
(constant when the mask is, which folding then folds) and cast like the input, once per graph for
each mask input (every layer of a BERT reads one mask_index: `ImportContext.made` hands the first
layer's term to the others, whose key length T must be the first layer's, as in every encoder or
decoder stack); it reaches the Attention as an additive mask [B | 1, 1 | N, S | 1, T]:

    mask_index [B] (keys j >= length masked), [B, T] (raw: 0 masked), [B, S, T] (raw, per query);
    MultiHeadAttention's key_padding_mask [B] / [B, T]; attention_bias [B | 1, N | 1, S, T] added.

Not supported (a NodeAttributeError naming the op and input or attribute, with a hint): past /
present state (past, past_key, past_value, present outputs), past_sequence_length, the [2B]
start/end and the 4-D Megatron mask_index forms, MultiHeadAttention's [3B + 2] key_padding_mask,
do_rotary, the qk output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.models.collective import MS_DOMAIN
from polykit.compiler.ops.nn.fused import MASK_CAUSAL
from polykit.compiler.ops.node_emitter import NodeEmitter
from polykit.compiler.ops.registry import ImportContext, InferContext, find_shape_rule, importer
from polykit.errors import NodeAttributeError, PolykitError

#: onnxruntime's default for a masked score (added to it)
MASK_FILTER_VALUE = -10000.0
#: the largest |mask_filter_value| with which the causal term's keys certainly softmax to 0 (module docstring)
HINT_FILTER_BOUND = 1e30
#: ranks of contrib outputs that feed a mask: (op, output) -> rank (EmbedLayerNormalization's
#: mask_index, which the optimizer hands every Attention of the model)
CONTRIB_OUTPUT_RANKS = {("EmbedLayerNormalization", 1): 1}


def _refuse(node: Node, what: str, hint: str) -> NodeAttributeError:
    return NodeAttributeError(f"{MS_DOMAIN} {node.op_type}: {what} is not supported", where=node.describe(),
                              hint=hint)


def _present(node: Node, i: int) -> bool:
    return i < len(node.inputs) and bool(node.inputs[i])


def _refuse_inputs(node: Node, positions: dict[int, str]) -> None:
    for i, name in positions.items():
        if _present(node, i):
            raise _refuse(node, f"input {i} ({name})",
                          "export without a key/value cache (past state), or run the model with onnxruntime")


def _refuse_outputs(node: Node, first: int) -> None:
    extra = [o for o in node.outputs[first:] if o]
    if extra:
        raise _refuse(node, f"output(s) {extra} (present state / qk scores)",
                      "export without a key/value cache: only the attention output is supported")


def _rank(ctx: ImportContext, name: str, depth: int = 8) -> int | None:
    """The rank of tensor `name`: from the model's value info, else from its producer's shape rule
    over its inputs' (up to `depth` producers back; the optimizer's mask_index is ReduceSum(Cast(mask)),
    an intermediate without value info). None when unknown."""
    shape = _shape(ctx, name, depth)
    return None if shape is None else len(shape)


def _shape(ctx: ImportContext, name: str, depth: int):
    value = ctx.graph.values.get(name)
    if value is not None and value.shape is not None:
        return value.shape
    if name in ctx.graph.initializers:
        return ctx.graph.initializers[name].shape
    producer = next((n for n in ctx.graph.nodes if name in n.outputs), None) if depth > 0 else None
    if producer is not None and producer.domain == MS_DOMAIN:  # not imported yet: no shape rule
        rank = CONTRIB_OUTPUT_RANKS.get((producer.op_type, producer.outputs.index(name)))
        return None if rank is None else (None,) * rank
    rule = find_shape_rule(producer.domain, producer.op_type) if producer is not None else None
    if rule is None or producer.domain:
        return None
    known = [ctx.graph.values.get(i) for i in producer.inputs]
    dtypes = [ctx.const(i).dtype if ctx.const(i) is not None else (v.dtype if v is not None else None)
              for i, v in zip(producer.inputs, known)]
    shapes = [_shape(ctx, i, depth - 1) if i else None for i in producer.inputs]
    try:
        results = rule(InferContext(producer, dtypes, shapes, [ctx.const(i) for i in producer.inputs]))
    except PolykitError:
        return None
    result = results[producer.outputs.index(name)]
    return result[1] if isinstance(result, tuple) else result.shape


def _expect_rank(ctx: ImportContext, node: Node, i: int, ranks: tuple[int, ...], what: str) -> int | None:
    """Input i's rank when known; a NodeAttributeError when it is not one of `ranks`."""
    rank = _rank(ctx, node.inputs[i])
    if rank is not None and rank not in ranks:
        raise _refuse(node, f"input {i} of rank {rank}", f"give {what}")
    return rank


class _Lowering(NodeEmitter):
    """The replacement nodes of one contrib attention node; `x` is a tensor whose dtype masks take."""

    def __init__(self, node: Node, ctx: ImportContext, x: str):
        super().__init__(node, ctx)
        self.x = x
        self.heads = int(node.attrs.get("num_heads", 0))
        if self.heads <= 0:
            raise NodeAttributeError(f"{MS_DOMAIN} {node.op_type} needs a positive num_heads attribute",
                                     where=node.describe(),
                                     hint="set the node's num_heads attribute (optimize_model's num_heads argument writes it)")
        self.filter = float(node.attrs.get("mask_filter_value", MASK_FILTER_VALUE))
        self.terms: list[str] = []

    def ints(self, values, prefix: str) -> str:
        return self.const(np.asarray(values, np.int64), prefix)

    def split(self, tensor: str, sizes: list[int], axis: int) -> list[str]:
        outs = [self.ctx.graph.fresh_name(f"{self.node.name}_{n}") for n in "qkv"[: len(sizes)]]
        self.nodes.append(Node("Split", [tensor, self.ints(sizes, "split")], outs, {"axis": axis},
                               name=self.ctx.graph.fresh_name(f"{self.node.name}_Split")))
        return outs

    def heads_first(self, tensor: str) -> str:
        """[B, S, N*h] -> [B, N, S, h]."""
        split = self("Reshape", [tensor, self.ints([0, 0, self.heads, -1], "heads")])
        return self("Transpose", [split], perm=[0, 2, 1, 3])

    def pick(self, packed: str, index: int, axis: int) -> str:
        """Slot `index` of a packed [B, S, N, k, h] tensor, as [B, N, S, h]."""
        one = self("Gather", [packed, self.const(np.asarray(index, np.int64), "slot")], axis=axis)
        return self("Transpose", [one], perm=[0, 2, 1, 3])

    def length(self, tensor: str, axis: int) -> str:
        """The size of `tensor`'s axis `axis` as a 1-element int64 tensor."""
        shape = self("Shape", [tensor])
        return self("Gather", [shape, self.ints([axis], "axis")], axis=0)

    def positions(self, tensor: str, axis: int) -> str:
        """[0, 1, ..., n - 1] (int64) for the size n of `tensor`'s axis `axis`."""
        n = self("Squeeze", [self.length(tensor, axis), self.ints([0], "axes")])
        return self("Range", [self.const(np.asarray(0, np.int64), "zero"), n, self.const(np.asarray(1, np.int64), "one")])

    def masked(self, hidden: str, value: float | None = None) -> str:
        """`value` (default `filter`) where bool `hidden` is True, else 0, in the input's dtype."""
        value = self.filter if value is None else value
        filt = self("CastLike", [self.const(np.asarray(value, np.float32), "filter"), self.x])
        zero = self("CastLike", [self.const(np.asarray(0.0, np.float32), "zero"), self.x])
        return self("Where", [hidden, filt, zero])

    def once(self, key: tuple, make) -> None:
        """Add the term `make()` gives, or the one an earlier node of the graph made under `key`
        (every layer of a BERT reads one mask: one mask tensor, not one per layer)."""
        key = (MS_DOMAIN, self.filter) + key
        if key not in self.ctx.made:
            self.ctx.made[key] = make()
        self.terms.append(self.ctx.made[key])

    def key_padding(self, mask: str, keys: str, what: str, allow_3d: bool) -> None:
        """The [B, 1, 1 | S, T] term of a [B] lengths / [B, T] raw / ([B, S, T] raw) int mask; `keys`
        is a [B, N, T, h] tensor (for T: the first layer's, which every layer reading the mask shares)."""
        rank = _rank(self.ctx, mask)
        if rank == 1:
            def make() -> str:
                lengths = self("Unsqueeze", [mask, self.ints([1, 2, 3], "axes")])
                positions = self("CastLike", [self.positions(keys, 2), mask])  # a constant once T is known
                return self.masked(self("GreaterOrEqual", [positions, lengths]))
        elif rank == 2 or rank == 3 and allow_3d:  # raw: 0 (or less) masks
            def make() -> str:
                full = self("Unsqueeze", [mask, self.ints([1, 2] if rank == 2 else [1], "axes")])
                zero = self("CastLike", [self.const(np.asarray(0), "zero"), mask])
                return self.masked(self("LessOrEqual", [full, zero]))
        else:
            forms = "[B] lengths, [B, T]" + (" or [B, S, T]" if allow_3d else "")
            raise _refuse(self.node, f"{what} of rank {rank if rank is not None else 'unknown'}",
                          f"give a {forms} int mask (the optimizer's default forms); the input needs a known rank")
        self.once(("padding", mask), make)

    def causal(self, q: str, k: str) -> None:
        """Keys after the query's position masked ([S, T], no past: T = S) with the lowest float
        (onnxruntime's causal mask; -inf in float16), not mask_filter_value."""
        def make() -> str:
            rows = self("Unsqueeze", [self.positions(q, 2), self.ints([1], "axes")])
            return self.masked(self("Greater", [self.positions(k, 2), rows]), float(np.finfo(np.float32).min))

        self.once(("causal",), make)

    def attention(self, q: str, k: str, v: str, bias_at: int) -> list[Node]:
        """The ai.polykit Attention of [B, N, S, h] Q, K, V and the mask terms (the padding term
        added before, the causal one when `unidirectional`, the node's input `bias_at`, the
        attention_bias), written to the node's output as [B, S, N*h_v]; the replacement nodes."""
        if int(self.node.attrs.get("unidirectional", 0)):
            self.causal(q, k)
        if _present(self.node, bias_at):
            self.terms.append(self.node.inputs[bias_at])
        scale = float(self.node.attrs.get("scale", 0.0))
        inputs = [q, k, v]
        if self.terms:
            total = self.terms[0]
            for term in self.terms[1:]:
                total = self("Add", [total, term])
            inputs.append(total)
        attrs: dict[str, Any] = {"fused_from": [self.node.name]}
        if int(self.node.attrs.get("unidirectional", 0)) and not _present(self.node, bias_at) \
                and abs(self.filter) <= HINT_FILTER_BOUND:
            attrs[MASK_CAUSAL] = 0
        if scale:
            attrs["scale"] = float(scale)
        out = self.ctx.graph.fresh_name(f"{self.node.name}_attention")
        self.nodes.append(Node("Attention", inputs, [out], attrs, name=self.ctx.graph.fresh_name(f"{self.node.name}_attention"),
                               domain=POLYKIT_DOMAIN))
        merged = self("Transpose", [out], perm=[0, 2, 1, 3])
        self("Reshape", [merged, self.ints([0, 0, -1], "merge")], output=self.node.outputs[0])
        return self.nodes


@importer("Attention", since=1, domain=MS_DOMAIN)
def _ms_attention(node: Node, ctx: ImportContext) -> list[Node]:
    """input [B, S, C] @ weights [C, Dq + Dk + Dv] (+ bias), mask_index, attention_bias (input 5)."""
    _refuse_inputs(node, {4: "past", 6: "past_sequence_length"})
    _refuse_outputs(node, 1)
    if int(node.attrs.get("do_rotary", 0)):
        raise _refuse(node, "attribute do_rotary", "export the model without the optimizer's rotary fusion")
    if int(node.attrs.get("past_present_share_buffer", 0)):
        raise _refuse(node, "attribute past_present_share_buffer", "export without a key/value cache")
    x, weights = node.inputs[0], node.inputs[1]
    low = _Lowering(node, ctx, x)
    w = ctx.const(weights)
    sizes = [int(s) for s in node.attrs.get("qkv_hidden_sizes", ())]
    if not sizes:
        if w is None or w.ndim != 2 or w.shape[1] % 3:
            raise _refuse(node, "weights that are not a constant [C, 3 * hidden] without qkv_hidden_sizes",
                          "give the weights as an initializer or set qkv_hidden_sizes")
        sizes = [w.shape[1] // 3] * 3
    if len(sizes) != 3 or any(s <= 0 or s % low.heads for s in sizes) or sizes[0] != sizes[1]:
        raise _refuse(node, f"qkv_hidden_sizes {sizes}",
                      f"give three positive sizes, each divisible by num_heads {low.heads}, Q's equal to K's")
    if w is not None and (w.ndim != 2 or w.shape[1] != sum(sizes)):
        raise _refuse(node, f"weights of shape {w.shape} with qkv sizes {sizes}",
                      "the weights must be [input_hidden, sum(qkv_hidden_sizes)]")
    proj = low("MatMul", [x, weights])
    if _present(node, 2):
        proj = low("Add", [proj, node.inputs[2]])
    q, k, v = (low.heads_first(t) for t in low.split(proj, sizes, axis=2))
    if _present(node, 3):
        if _rank(ctx, node.inputs[3]) == 4:
            raise _refuse(node, "the 4-D (Megatron) mask_index", "give a [B], [B, T] or [B, S, T] mask")
        mask_len = ctx.graph.values.get(node.inputs[3])
        batch = ctx.graph.values.get(x)
        if _rank(ctx, node.inputs[3]) == 1 and mask_len is not None and batch is not None and batch.shape \
                and isinstance(mask_len.shape[0], int) and isinstance(batch.shape[0], int) \
                and mask_len.shape[0] == 2 * batch.shape[0] != batch.shape[0]:
            raise _refuse(node, "the [2B] (end and start positions) mask_index",
                          "give [B] lengths (right padding) or a [B, T] 0/1 mask")
        low.key_padding(node.inputs[3], k, "mask_index", allow_3d=True)
    return low.attention(q, k, v, bias_at=5)


@importer("MultiHeadAttention", since=1, domain=MS_DOMAIN)
def _ms_multi_head_attention(node: Node, ctx: ImportContext) -> list[Node]:
    """query [B, S, D] (or packed QKV [B, S, N, 3, h]), key [B, L, D] (or packed KV [B, L, N, 2, h],
    or [B, N, L, h]), value [B, L, Dv] (or [B, N, L, h]), bias [D + D + Dv], key_padding_mask,
    attention_bias."""
    _refuse_inputs(node, {6: "past_key", 7: "past_value", 8: "past_sequence_length", 9: "cache_indirection"})
    _refuse_outputs(node, 1)
    query = node.inputs[0]
    low = _Lowering(node, ctx, query)
    has_k, has_v, has_bias = _present(node, 1), _present(node, 2), _present(node, 3)
    # the form follows from which inputs are given (onnxruntime's rule); a known rank must agree
    # (an unknown one, e.g. behind another contrib op, is taken to be the form's)
    if not has_k and not has_v:
        _expect_rank(ctx, node, 0, (5,), "a packed QKV query (no key and value) [B, S, N, 3, h]")
        if has_bias:
            raise _refuse(node, "packed QKV query with bias", "add the bias before packing")
        q, k, v = (low.pick(query, i, 3) for i in range(3))
    elif has_k and not has_v:
        _expect_rank(ctx, node, 0, (3,), "a query [B, S, D]")
        _expect_rank(ctx, node, 1, (5,), "a packed KV key (no value) [B, L, N, 2, h]")
        if has_bias:
            raise _refuse(node, "packed KV key with bias", "add the bias before packing")
        k, v = (low.pick(node.inputs[1], i, 3) for i in range(2))
        q = low.heads_first(query)
    elif has_k and has_v:
        _expect_rank(ctx, node, 0, (3,), "a query [B, S, D]")
        rk = _expect_rank(ctx, node, 1, (3, 4), "a key [B, L, D] or [B, N, L, h]") or 3
        _expect_rank(ctx, node, 2, (rk,), f"a value of the key's rank {rk}")
        if has_bias and rk == 4:
            raise _refuse(node, "bias with [B, N, L, h] key and value", "add the bias to the query only")
        tensors = [query, node.inputs[1], node.inputs[2]]
        if has_bias:
            bias = node.inputs[3]
            b = ctx.const(bias)
            if b is None or b.ndim != 1 or b.shape[0] % 3:
                raise _refuse(node, "a bias that is not a constant [3 * D]",
                              "give the bias as an initializer (query, key and value of one width)")
            sizes = [b.shape[0] // 3] * 3
            tensors = [low("Add", [t, piece]) for t, piece in zip(tensors, low.split(bias, sizes, axis=0))]
        q = low.heads_first(tensors[0])
        k, v = (low.heads_first(t) for t in tensors[1:]) if rk == 3 else tensors[1:]
    else:
        raise _refuse(node, "a value without a key", "give key and value, a packed KV key, or a packed QKV query")
    if _present(node, 4):
        low.key_padding(node.inputs[4], k, "key_padding_mask", allow_3d=False)
    return low.attention(q, k, v, bias_at=5)
