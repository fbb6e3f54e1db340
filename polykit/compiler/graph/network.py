"""NetworkDefinition: build a polykit Graph from scratch, layer by layer (TensorRT's API path).

    net = NetworkDefinition("tiny")
    x = net.add_input("x", np.float32, (1, 3, 8, 8))
    y = net.add_activation(net.add_conv(x, weight, bias, pads=(1, 1, 1, 1)), "relu")
    net.mark_output(y)
    plan = Builder(BuilderConfig(target="cpu")).build(net.graph)

Every add_* method appends ONNX-level nodes (canonical opset form), checks them at once
with the op's shape rule (a ShapeError points at the call that went wrong), and returns
the name of the output tensor: tensors are handled by name, as in the Graph IR. Arrays
passed where a tensor is expected become constants.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import Graph, Node, Value
from polykit.compiler.graph.infer import result_value
from polykit.compiler.ops.registry import CANONICAL_OPSET, InferContext, find_shape_rule
from polykit.errors import GraphError, UnsupportedModelError, UsageError
from polykit.compiler.ops.elementwise_table import api_table

TensorLike = str | np.ndarray | float | int

REDUCE_OPS = {
    "sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd",
    "l1": "ReduceL1", "l2": "ReduceL2", "sum_square": "ReduceSumSquare", "log_sum": "ReduceLogSum",
    "log_sum_exp": "ReduceLogSumExp",
}
POOLING = {"max": "MaxPool", "average": "AveragePool", "global_max": "GlobalMaxPool",
           "global_average": "GlobalAveragePool"}
NORMALIZATIONS = {"layer": "LayerNormalization", "batch": "BatchNormalization",
                  "instance": "InstanceNormalization", "group": "GroupNormalization"}


def _pick(table: dict[str, Any], key: str, what: str) -> Any:
    try:
        return table[key.lower()]
    except KeyError:
        raise UsageError(f"unknown {what} {key!r}", hint=f"use one of: {', '.join(sorted(table))}") from None


class NetworkDefinition:
    """A network under construction; `.graph` gives the shape-inferred Graph the Builder takes."""

    def __init__(self, name: str = "network"):
        self._graph = Graph(name=name, opsets={"": CANONICAL_OPSET})
        self._count = 0

    # ---- tensors -------------------------------------------------------------------------
    def add_input(self, name: str, dtype: Any, shape: Sequence[int | str]) -> str:
        if self._defined(name):
            raise GraphError(f"tensor {name!r} already exists", where=f"network {self._graph.name!r}")
        self._graph.inputs.append(name)
        self._graph.set_value(Value(name, np.dtype(dtype), tuple(shape)))
        return name

    def add_constant(self, array: Any, name: str | None = None) -> str:
        arr = np.asarray(array)
        if name is None:
            name = self._fresh("const")
        elif self._defined(name):
            raise GraphError(f"tensor {name!r} already exists", where=f"network {self._graph.name!r}")
        self._graph.initializers[name] = arr
        self._graph.set_value(Value(name, arr.dtype, tuple(arr.shape)))
        return name

    def mark_output(self, tensor: str) -> None:
        self._check(tensor)
        if tensor not in self._graph.outputs:
            self._graph.outputs.append(tensor)

    def shape(self, tensor: str) -> tuple:
        return self._check(tensor).shape

    def dtype(self, tensor: str) -> np.dtype:
        return self._check(tensor).dtype

    @property
    def graph(self) -> Graph:
        """A shape-inferred copy of the network as a Graph (GraphError if it has no outputs)."""
        if not self._graph.outputs:
            raise GraphError("the network has no outputs", where=f"network {self._graph.name!r}",
                             hint="call mark_output(tensor) for each result")
        from polykit.compiler.graph.infer import infer_shapes

        g = self._graph.copy()
        g.validate()
        infer_shapes(g)
        return g

    # ---- layers --------------------------------------------------------------------------
    def add_elementwise(self, a: TensorLike, b: TensorLike, op: str, name: str | None = None) -> str:
        """add, sub, mul, div, pow, max, min, mod, equal, less, ..., bitwise_and, ... (api_table("binary"))."""
        return self._add(_pick(api_table("binary"), op, "elementwise op").name, [a, b], name=name)

    def add_unary(self, x: TensorLike, op: str, name: str | None = None) -> str:
        """abs, neg, sqrt, exp, log, erf, ..., not (api_table("unary"))."""
        return self._add(_pick(api_table("unary"), op, "unary op").name, [x], name=name)

    def add_activation(self, x: TensorLike, kind: str, name: str | None = None, **params: Any) -> str:
        """relu, sigmoid, tanh, leaky_relu(alpha), elu(alpha), gelu(approximate), ... (api_table("activation")),
        clip(min, max), prelu(slope)."""
        kind = kind.lower()
        if kind == "clip":
            lo, hi = params.pop("min", None), params.pop("max", None)
            self._no_extra(params, kind)
            dt = self.dtype(self._tensor(x))
            ins = [x, "" if lo is None else np.array(lo, dt), "" if hi is None else np.array(hi, dt)]
            return self._add("Clip", ins, name=name)
        if kind == "prelu":
            return self._add("PRelu", [x, params.pop("slope")], name=name)
        row = _pick(api_table("activation"), kind, "activation")
        attrs = {k: params.pop(k) for k in list(params) if k in row.api_params}
        self._no_extra(params, kind)
        return self._add(row.name, [x], attrs, name=name)

    def add_conv(self, x: TensorLike, weight: TensorLike, bias: TensorLike | None = None, strides=None, pads=None,
                 dilations=None, groups: int = 1, name: str | None = None) -> str:
        attrs = _ints(strides=strides, pads=pads, dilations=dilations)
        attrs["group"] = int(groups)
        return self._add("Conv", [x, weight] + ([] if bias is None else [bias]), attrs, name=name)

    def add_matmul(self, a: TensorLike, b: TensorLike, name: str | None = None) -> str:
        return self._add("MatMul", [a, b], name=name)

    def add_gemm(self, a: TensorLike, b: TensorLike, c: TensorLike | None = None, alpha: float = 1.0,
                 beta: float = 1.0, trans_a: bool = False, trans_b: bool = False, name: str | None = None) -> str:
        attrs = {"alpha": float(alpha), "beta": float(beta), "transA": int(trans_a), "transB": int(trans_b)}
        return self._add("Gemm", [a, b] + ([] if c is None else [c]), attrs, name=name)

    def add_pooling(self, x: TensorLike, kind: str, kernel_shape=None, strides=None, pads=None,
                    ceil_mode: bool = False, count_include_pad: bool = False, name: str | None = None) -> str:
        op = _pick(POOLING, kind, "pooling kind")
        if op.startswith("Global"):
            return self._add(op, [x], name=name)
        if kernel_shape is None:
            raise UsageError(f"{kind} pooling needs kernel_shape")
        attrs = _ints(kernel_shape=kernel_shape, strides=strides, pads=pads)
        attrs["ceil_mode"] = int(ceil_mode)
        if op == "AveragePool":
            attrs["count_include_pad"] = int(count_include_pad)
        return self._add(op, [x], attrs, name=name)

    def add_softmax(self, x: TensorLike, axis: int = -1, log: bool = False, name: str | None = None) -> str:
        return self._add("LogSoftmax" if log else "Softmax", [x], {"axis": int(axis)}, name=name)

    def add_reduce(self, x: TensorLike, op: str, axes: Sequence[int] | None = None, keepdims: bool = True,
                   name: str | None = None) -> str:
        ins = [x] if axes is None else [x, np.array(list(axes), np.int64)]
        return self._add(_pick(REDUCE_OPS, op, "reduce op"), ins, {"keepdims": int(keepdims)}, name=name)

    def add_reshape(self, x: TensorLike, shape: Sequence[int], name: str | None = None) -> str:
        return self._add("Reshape", [x, np.array(list(shape), np.int64)], name=name)

    def add_transpose(self, x: TensorLike, perm: Sequence[int], name: str | None = None) -> str:
        return self._add("Transpose", [x], {"perm": [int(p) for p in perm]}, name=name)

    def add_shuffle(self, x: TensorLike, first_transpose: Sequence[int] | None = None,
                    reshape: Sequence[int] | None = None, second_transpose: Sequence[int] | None = None,
                    name: str | None = None) -> str:
        """TensorRT's shuffle: optional transpose, reshape, transpose (each skipped when None)."""
        out = self._tensor(x)
        stem = name or self._fresh("Shuffle")
        for i, (kind, arg) in enumerate((("t", first_transpose), ("r", reshape), ("t", second_transpose))):
            if arg is None:
                continue
            part = f"{stem}_{i}"
            out = self.add_transpose(out, arg, name=part) if kind == "t" else self.add_reshape(out, arg, name=part)
        return out if out != x else self.add_identity(out, name=stem)

    def add_flatten(self, x: TensorLike, axis: int = 1, name: str | None = None) -> str:
        return self._add("Flatten", [x], {"axis": int(axis)}, name=name)

    def add_concat(self, tensors: Sequence[TensorLike], axis: int, name: str | None = None) -> str:
        return self._add("Concat", list(tensors), {"axis": int(axis)}, name=name)

    def add_slice(self, x: TensorLike, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
                  steps: Sequence[int] | None = None, name: str | None = None) -> str:
        ins: list[Any] = [x, np.array(list(starts), np.int64), np.array(list(ends), np.int64)]
        if axes is not None or steps is not None:
            ins.append("" if axes is None else np.array(list(axes), np.int64))
        if steps is not None:
            ins.append(np.array(list(steps), np.int64))
        return self._add("Slice", ins, name=name)

    def add_gather(self, x: TensorLike, indices: TensorLike, axis: int = 0, name: str | None = None) -> str:
        if not isinstance(indices, str):
            indices = np.asarray(indices, dtype=np.int64)
        return self._add("Gather", [x, indices], {"axis": int(axis)}, name=name)

    def add_normalization(self, x: TensorLike, scale: TensorLike, bias: TensorLike, kind: str = "layer",
                          axis: int = -1, epsilon: float = 1e-5, mean: TensorLike | None = None,
                          var: TensorLike | None = None, num_groups: int | None = None,
                          name: str | None = None) -> str:
        """layer (axis), batch (inference: needs mean and var), instance or group (num_groups) normalization."""
        op = _pick(NORMALIZATIONS, kind, "normalization kind")
        attrs: dict[str, Any] = {"epsilon": float(epsilon)}
        ins: list[Any] = [x, scale, bias]
        if op == "LayerNormalization":
            attrs["axis"] = int(axis)
        elif op == "BatchNormalization":
            if mean is None or var is None:
                raise UsageError("batch normalization needs mean and var", hint="pass mean=..., var=...")
            ins += [mean, var]
        elif op == "GroupNormalization":
            if num_groups is None:
                raise UsageError("group normalization needs num_groups")
            attrs["num_groups"] = int(num_groups)
        return self._add(op, ins, attrs, name=name)

    def add_identity(self, x: TensorLike, name: str | None = None) -> str:
        return self._add("Identity", [x], name=name)

    def add_cast(self, x: TensorLike, dtype: Any, name: str | None = None) -> str:
        from polykit.compiler.ir.dtypes import to_onnx

        return self._add("Cast", [x], {"to": to_onnx(dtype)}, name=name)

    def add_where(self, condition: TensorLike, a: TensorLike, b: TensorLike, name: str | None = None) -> str:
        return self._add("Where", [condition, a, b], name=name)

    def add_node(self, op_type: str, inputs: Sequence[TensorLike], attrs: dict[str, Any] | None = None,
                 num_outputs: int = 1, domain: str = "", name: str | None = None) -> list[str]:
        """Any registered op (the escape hatch): returns all its output names."""
        return self._add_node(op_type, inputs, dict(attrs or {}), num_outputs, domain, name)

    # ---- internals -----------------------------------------------------------------------
    def _add(self, op_type: str, inputs: Sequence[Any], attrs: dict[str, Any] | None = None,
             name: str | None = None) -> str:
        return self._add_node(op_type, inputs, dict(attrs or {}), 1, "", name)[0]

    def _add_node(self, op_type, inputs, attrs, num_outputs, domain, name) -> list[str]:
        g = self._graph
        layer = name or self._fresh(op_type)
        if any(n.name == layer for n in g.nodes):
            raise GraphError(f"a layer named {layer!r} already exists", where=f"network {g.name!r}")
        names = [self._tensor(t) for t in inputs]
        outputs = [layer if num_outputs == 1 else f"{layer}_{i}" for i in range(num_outputs)]
        for out in outputs:
            if self._defined(out):
                raise GraphError(f"tensor {out!r} already exists", where=f"network {g.name!r}",
                                 hint="give the layer another name")
        node = Node(op_type, names, outputs, attrs, layer, domain)
        rule = find_shape_rule(domain, op_type)
        if rule is None:
            raise UnsupportedModelError([(layer, op_type, domain, CANONICAL_OPSET)], where=f"network {g.name!r}")
        values = [g.value(n) if n else Value("") for n in names]
        consts = [g.initializers.get(n) if n else None for n in names]
        results = rule(InferContext(node, [v.dtype for v in values], [v.shape for v in values], consts, values))
        g.nodes.append(node)
        for out, result in zip(outputs, results):
            g.set_value(result_value(out, result))
        return outputs

    def _tensor(self, t: Any) -> str:
        if isinstance(t, str):
            if t:
                self._check(t)
            return t
        if t is None:
            return ""
        return self.add_constant(t)

    def _check(self, tensor: str) -> Value:
        if not self._defined(tensor):
            raise GraphError(f"the network has no tensor {tensor!r}", where=f"network {self._graph.name!r}",
                             hint="use the names returned by add_* methods")
        return self._graph.value(tensor)

    def _defined(self, name: str) -> bool:
        g = self._graph
        return name in g.inputs or name in g.initializers or any(name in n.outputs for n in g.nodes)

    def _fresh(self, prefix: str) -> str:
        while True:
            self._count += 1
            candidate = f"{prefix}_{self._count}"
            if not self._defined(candidate) and not any(n.name == candidate for n in self._graph.nodes):
                return candidate

    @staticmethod
    def _no_extra(params: dict[str, Any], kind: str) -> None:
        if params:
            raise UsageError(f"activation {kind!r} takes no parameter(s) {', '.join(sorted(params))}")


def _ints(**lists: Any) -> dict[str, list[int]]:
    return {k: [int(v) for v in vals] for k, vals in lists.items() if vals is not None}
