"""absorb_quantized_casts: an --fp16 build's Casts around INT8 / FP8 layers, taken into the layers' epilogues.

The precision pass keeps an INT8 or FP8 layer (QConv / QMatMul / QConvNHWC) in float32: its scale, bias and
epilogue are float32, so it writes float32 that a Cast turns into float16 for its half readers, and reads a
half residual through a Cast to float32. In BERT-base's explicit FP8 plan those are seven Casts an encoder
layer (84 kernels); in an INT8 ResNet-50 the last conv's float32 output (12.8 MB at batch 32) is cast for the
float16 pooling. This pass moves them inside:

- output (INT8 and FP8): a layer with a float output (no Y_scale) whose sole reader is `Cast(to=float16)` ends
  its epilogue in that Cast (one made when it has none) and writes the Cast's output: the float32 value
  rounded to float16 as the Cast rounded it (every cuda INT8 / FP8 kernel stores it as float16, int8_out.cuh's
  Y_OUT 3: half the bytes, and no Cast layer);
- extra inputs (FP8): an epilogue input written by `Cast(to=float32)` of a float16 tensor is read as that
  tensor, the epilogue's first step the same Cast (exact: every float16 value is a float32 one).

Both are the same operations in the same order, so the plan computes what it computed with the Casts as
layers (tests/compiler/passes/test_absorb_quantized_casts.py: bit for bit on the cpu).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Graph, Node
from polykit.compiler.ops.quant.int8 import FP8, INT8_KINDS, QUANT_ARITY, X, Y_SCALE, epilogue_result
from polykit.compiler.passes.rewrite import protected

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
FLOAT, FLOAT16 = 1, 10


def _quantized_layer(node: Node) -> bool:
    return node.domain == POLYKIT_DOMAIN and node.op_type in INT8_KINDS


def _fp8_layer(graph: Graph, node: Node) -> bool:
    return _quantized_layer(node) and FP8 is not None and graph.value(node.inputs[X]).dtype == FP8


def _is_cast(node: Node | None, to: int) -> bool:
    return node is not None and node.domain == "" and node.op_type == "Cast" and int(node.attrs.get("to", 0)) == to


def absorb_quantized_casts(graph: Graph, keep: Iterable[str] = ()) -> bool:
    kept = protected(graph, keep)
    producers, readers = graph.producers(), graph.consumers()
    dead: list[Node] = []
    changed = False
    for node in graph.nodes:
        if not _quantized_layer(node):
            continue
        for name in dict.fromkeys(node.inputs[QUANT_ARITY:]) if _fp8_layer(graph, node) else ():
            cast = producers.get(name)
            if name and _is_cast(cast, FLOAT) and graph.value(cast.inputs[0]).dtype == F16:
                _read_half(graph, node, name, cast.inputs[0])
                changed = True
        out = node.outputs[0]
        users = readers.get(out, [])
        if (len(users) == 1 and _is_cast(users[0], FLOAT16) and out not in kept
                and (len(node.inputs) <= Y_SCALE or not node.inputs[Y_SCALE]) and graph.value(out).dtype == F32):
            _write_half(graph, node, users[0])
            dead.append(users[0])
            changed = True
    graph.remove_nodes(dead)
    return changed


def _epilogue(graph: Graph, node: Node) -> dict:
    """The node's epilogue (a copy it owns), or a new one that passes the product through: its input a fresh
    name, no step (the caller adds them)."""
    epilogue = node.attrs.get("epilogue")
    if epilogue:
        epilogue = {"input": epilogue["input"], "body": [dict(step) for step in epilogue["body"]]}
    else:
        epilogue = {"input": graph.fresh_name(f"{node.name}_product"), "body": []}
    node.attrs = {**node.attrs, "epilogue": epilogue}
    return epilogue


def _read_half(graph: Graph, node: Node, cast_out: str, half: str) -> None:
    """The layer reads `half` in place of `cast_out` (its float32 Cast), the Cast its epilogue's first step."""
    epilogue = _epilogue(graph, node)
    local = graph.fresh_name(f"{cast_out}_in_epilogue")
    for step in epilogue["body"]:
        step["inputs"] = [local if i == cast_out else i for i in step["inputs"]]
    epilogue["body"].insert(0, {"op": "Cast", "inputs": [half], "outputs": [local], "attrs": {"to": FLOAT}})
    inputs = [half if i == cast_out else i for i in node.inputs]
    node.inputs = inputs[:QUANT_ARITY] + list(dict.fromkeys(inputs[QUANT_ARITY:]))


def _write_half(graph: Graph, node: Node, cast: Node) -> None:
    """The layer writes `cast`'s float16 output, the Cast its epilogue's last step."""
    epilogue = _epilogue(graph, node)
    half = cast.outputs[0]
    result = epilogue_result(epilogue) if epilogue["body"] else epilogue["input"]  # the float32 output's value
    epilogue["body"].append({"op": "Cast", "inputs": [result], "outputs": [half], "attrs": {"to": FLOAT16}})
    node.outputs = [half] + list(node.outputs[1:])
    fused = list(node.attrs.get("fused_from") or ())
    node.attrs["fused_from"] = fused + [cast.name] if cast.name else fused
