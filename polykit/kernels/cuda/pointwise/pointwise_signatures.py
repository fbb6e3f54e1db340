"""The dtype signatures a pointwise module is compiled for: (input dtypes, output dtypes) of a
Pointwise layer (or of a plain elementwise op as a one-op body). Which dtype kinds each op
runs on, how it types its result and how it uses each input come from the elementwise op
table (polykit.compiler.ops.elementwise_table)."""

from __future__ import annotations

from polykit.compiler.ops.nn.concat_operands import concat_operands, group_inputs, logical_names
from polykit.compiler.ops.nn.view_operands import view_names
from polykit.kernels.cuda.pointwise.pointwise_expr import body_dtypes
from polykit.kernels.cuda.storage_types import CODE, CTYPE, INT_DTYPES
from polykit.compiler.ops.elementwise_table import FLOAT, elementwise_op

#: dtypes an input used only by Cast or as an exponent may have besides the layer's type
ALT_DTYPES = ("int64", "int32", "bool", "float32", "float16", "uint8", "int8", "float64")
#: further dtypes an exponent-only input may have (ONNX Pow's T1)
EXP_DTYPES = ("uint32", "uint64", "uint16", "int16")


def layer_body(layer) -> tuple[list[dict], tuple[str, ...], tuple[str, ...]]:
    """(body, inputs, outputs) of a Pointwise layer, or of a plain op as a one-op body."""
    if layer.kind == "Pointwise":  # a concatenated operand is one input, by its name (concat_operands)
        names = view_names(logical_names(tuple(layer.inputs), layer.attrs), layer.attrs)  # views: one name each
        return list(layer.attrs["body"]), tuple(names), tuple(layer.outputs)
    attrs = {k: v for k, v in layer.attrs.items() if k != "fused_from"}
    return [{"op": layer.kind, "inputs": list(layer.inputs), "outputs": list(layer.outputs), "attrs": attrs}], \
        tuple(layer.inputs), tuple(layer.outputs)


def sig_name(base: str, sig) -> str:
    ins, outs = sig
    return f"{base}__{'_'.join(CODE[d] for d in ins)}__{'_'.join(CODE[d] for d in outs)}"


def _row_of(op: dict):
    return elementwise_op(op["op"])


def _kinds(op: dict) -> frozenset[str]:
    row = _row_of(op)
    return row.kinds if row is not None else FLOAT


def _role(op: dict, slot: int) -> str:
    row = _row_of(op)
    return row.role(slot) if row is not None else "data"


def _input_roles(body, inputs) -> dict[str, set[str]]:
    """How each external input is used: 'cond' (bool operand), 'cast' (Cast source), 'exp', 'data'."""
    roles: dict[str, set[str]] = {n: set() for n in inputs}
    for op in body:
        for i, name in enumerate(op["inputs"]):
            if name in roles:
                roles[name].add(_role(op, i))
    return roles


def _compare_only_inputs(body, ins, outs, roles) -> list[str]:
    """Inputs whose values reach the outputs only through comparisons (their dtype never
    becomes an output's): e.g. the integer positions of Less(Add(range, offset), len)."""
    typed = set(outs)
    for op in reversed(body):
        row = _row_of(op)
        if (row is not None and row.result in ("bool", "cast")) or not typed & set(op["outputs"]):
            continue
        for i, name in enumerate(op["inputs"]):
            if _role(op, i) not in ("cond", "exp"):
                typed.add(name)
    return [n for n in ins if n not in typed and roles[n] and roles[n] <= {"data"}]


def stamped_signature(layer) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The one signature a plan layer needs, from the dtypes the builder stamped on it
    (LayerDesc.in_dtypes/out_dtypes, "" = omitted input); None when they are not set, do not
    match the layer's tensors, or name a type without a CUDA storage type."""
    in_dtypes, out_dtypes = tuple(getattr(layer, "in_dtypes", ())), tuple(getattr(layer, "out_dtypes", ()))
    if not out_dtypes or len(in_dtypes) != len(layer.inputs) or len(out_dtypes) != len(layer.outputs):
        return None
    names = tuple(layer.inputs)
    if layer.kind == "Pointwise" and layer.attrs.get("concat"):  # one dtype per concatenated operand
        entries = concat_operands(layer.attrs, len(names))
        names = tuple(logical_names(names, layer.attrs))
        in_dtypes = tuple(group_inputs(in_dtypes, entries, lambda e, ds: ds[0]))
    ins = tuple(d for n, d in zip(names, in_dtypes) if n)
    outs = tuple(out_dtypes)
    if not all(d in CTYPE for d in ins + outs):
        return None
    return ins, outs


def candidate_signatures(layer) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(input dtypes, output dtypes) the layer's module is compiled for: the plan's float type
    first, then the other float types, integer/bool types where the ops allow them, for
    inputs used only by Cast (masks, ids) or as an exponent the usual integer/bool types, and
    int64/int32 for inputs that only feed comparisons (positions building a mask). A plan
    layer whose dtypes the builder stamped gets exactly that one signature."""
    stamped = stamped_signature(layer)
    if stamped is not None:
        return [stamped]
    body, ins, outs = layer_body(layer)
    ins = [n for n in ins if n]
    kinds = [_kinds(op) for op in body]
    ints = all("int" in k for k in kinds)
    floats = ["float16", "float32"] if layer.precision == "fp16" else ["float32", "float16"]
    uniform = floats + ["float64", "bfloat16"] if all("float" in k for k in kinds) else []
    if ints:
        uniform += list(INT_DTYPES)
    if all("bool" in k for k in kinds):
        uniform.append("bool")
    roles = _input_roles(body, ins)
    sigs: list[dict[str, str]] = []
    for t in uniform:
        sigs.append({n: ("bool" if roles[n] == {"cond"} else t) for n in ins})
    alt_names = [n for n in ins if roles[n] and roles[n] <= {"cast", "exp"}]
    if len(alt_names) == 1:
        exp_only = roles[alt_names[0]] == {"exp"}
        # ONNX Pow: base T in {int32, int64, floats}, exponent T1 any numeric type
        bases = floats + (["int32", "int64"] if exp_only and ints else [])
        alts = ALT_DTYPES + (EXP_DTYPES if exp_only else ())
        for t in bases:
            for alt in alts:
                sig = {n: ("bool" if roles[n] == {"cond"} else t) for n in ins}
                sig[alt_names[0]] = alt
                sigs.append(sig)
    # masks built in the body from integer positions (Less(range, len) -> Where(mask, 0, -inf))
    cmp_names = _compare_only_inputs(body, ins, outs, roles)
    if cmp_names and len(cmp_names) < len(ins):
        for t in floats:
            for ct in ("int64", "int32"):
                sigs.append({n: ("bool" if roles[n] == {"cond"} else ct if n in cmp_names else t) for n in ins})
    out: list = []
    for sig in sigs:
        env = body_dtypes(body, sig)
        key = (tuple(sig[n] for n in ins), tuple(env.get(n, "float32") for n in outs))
        if key not in out and None not in key[1]:
            out.append(key)
    return out
