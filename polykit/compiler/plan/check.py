"""The one check of a plan's contents, run by Plan.deserialize before any target sees the plan.

The checksum catches a damaged file; this catches a well-formed one with impossible
contents (edited and re-checksummed, or written by a foreign tool), which would otherwise
crash a target, read or write outside device memory, or silently compute something else.
It has two steps:

- `check_document(doc, weights_len, where)`: the JSON document against the field tables
  of plan_schema (types, enums, bounds), then the RULES that relate fields: byte sizes
  are shape x itemsize, weights lie inside the weight blob, every non-weight tensor lies
  inside the arena and no two tensors live at once in the same bytes, lifetimes cover
  every use, layers read only tensors written before them, the kernel table is complete,
  per-profile tactics name one tactic per profile.
- `check_layers(plan, where)`: the layers against the op registry (shape inference re-run
  over the plan must give the plan's dtypes and shapes, so attributes pass the same rules
  the importer applies).

What needs the tactic table of this polykit (each layer's tactic is one its target has for
the layer's kind; a cuda plan's kernels, which it names but does not carry, regenerate from
those tactics as recorded) is the runtime's check when an Engine loads the plan
(polykit.runtime.tactic_check), still before the target sees it.

Every violation is a PlanError naming the field, e.g. `tensors['x'].offset`.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Mapping

import numpy as np

from polykit.compiler.plan.memory import ALIGNMENT, concat_rows
from polykit.compiler.plan.dims import check_dims, host_written
from polykit.compiler.plan.records import layer_as_node
from polykit.compiler.plan.sparse24 import ATTR, record_problem
from polykit.compiler.plan.schema import DOCUMENT_FIELDS, Invalid, nbytes_of, record, show
from polykit.errors import PlanError, PolykitError, UnsupportedModelError

_HINT = "the plan's contents are inconsistent (edited, or written by another tool); rebuild it with `polykit convert`"

Doc = Mapping[str, Any]


def check_document(doc: Any, weights_len: int, where: str = "plan") -> None:
    """PlanError naming the first field of `doc` (the plan's parsed JSON) that is invalid."""
    try:
        record(DOCUMENT_FIELDS)(doc, "")
        for rule in RULES:
            rule(doc, weights_len)
    except Invalid as bad:
        raise plan_error(bad, where) from None


def plan_error(bad: Invalid, where: str) -> PlanError:
    """The PlanError of one violation (polykit.runtime.tactic_check words its own so too)."""
    return PlanError(f"invalid plan field {bad.path}: {bad.what}", where=where, hint=_HINT)


# ---- rules over the whole document ------------------------------------------------------------
def _tensor_sizes(doc: Doc, weights_len: int) -> None:
    for name, t in doc["tensors"].items():
        if t["name"] != name:
            raise Invalid(f"tensors[{name!r}].name", f"{show(t['name'])} differs from its key")
        need = nbytes_of(t["dtype"], t["shape"])
        if t["nbytes"] != need and "dims" not in t:  # a dynamic tensor's size: plan_dims.check_dims
            raise Invalid(f"tensors[{name!r}].nbytes", f"{t['nbytes']} != {need} (shape {t['shape']} of {t['dtype']})")


def _weights(doc: Doc, weights_len: int) -> None:
    index = doc["weights"]
    for name, w in index.items():
        path = f"weights[{name!r}]"
        need = nbytes_of(w["dtype"], w["shape"])
        if w["nbytes"] != need:
            raise Invalid(f"{path}.nbytes", f"{w['nbytes']} != {need} (shape {w['shape']} of {w['dtype']})")
        if w["offset"] % ALIGNMENT:
            raise Invalid(f"{path}.offset", f"{w['offset']} is not a multiple of {ALIGNMENT}")
        if w["offset"] + w["nbytes"] > weights_len:
            raise Invalid(f"{path}.offset", f"bytes {w['offset']}..{w['offset'] + w['nbytes']} lie outside the "
                                            f"weight blob ({weights_len} bytes)")
    # a tensor's offset is into its own plan's weights; the index's into the file's one blob, where
    # a nested plan's weights follow those packed before them
    base = min((w["offset"] for w in index.values()), default=0)
    for name, t in doc["tensors"].items():
        if t["kind"] != "weight":
            continue
        w = index.get(name)
        if w is None:
            raise Invalid(f"tensors[{name!r}]", "is a weight the weight index does not list")
        w = {**w, "offset": w["offset"] - base}
        for key in ("dtype", "shape", "offset", "nbytes"):
            if t[key] != w[key]:
                raise Invalid(f"tensors[{name!r}].{key}", f"{show(t[key])} differs from weights[{name!r}].{key} "
                                                          f"{show(w[key])}")


def _io(doc: Doc, weights_len: int) -> None:
    tensors = doc["tensors"]
    for key, kinds in (("inputs", ("input",)), ("outputs", ("output", "input"))):
        seen: set[str] = set()
        for i, name in enumerate(doc[key]):
            if name in seen:
                raise Invalid(f"{key}[{i}]", f"{name!r} is listed twice")
            seen.add(name)
            if name not in tensors:
                raise Invalid(f"{key}[{i}]", f"{name!r} is not a tensor of the plan")
            if tensors[name]["kind"] not in kinds:
                raise Invalid(f"tensors[{name!r}].kind", f"{tensors[name]['kind']!r} for an engine {key[:-1]}")
    for name, t in tensors.items():
        listed = {"input": doc["inputs"], "output": doc["outputs"]}.get(t["kind"])
        if listed is not None and name not in listed:
            raise Invalid(f"tensors[{name!r}].kind", f"{t['kind']!r} but {name!r} is not in {t['kind']}s")


def _layer_io(doc: Doc, weights_len: int) -> None:
    tensors = doc["tensors"]
    available = host_written(doc) | {n for n, t in tensors.items() if t["kind"] == "weight"}
    names: set[str] = set()
    for layer in doc["layers"]:
        path = f"layers[{layer['name']!r}]"
        if layer["name"] in names:
            raise Invalid(f"{path}.name", "is not unique")
        names.add(layer["name"])
        for i, name in enumerate(layer["inputs"]):
            if name and name not in tensors:
                raise Invalid(f"{path}.inputs[{i}]", f"{name!r} is not a tensor of the plan")
            if name and name not in available:
                raise Invalid(f"{path}.inputs[{i}]", f"{name!r} is read before any layer writes it")
        for i, name in enumerate(layer["outputs"]):
            if not name:
                continue
            if name not in tensors:
                raise Invalid(f"{path}.outputs[{i}]", f"{name!r} is not a tensor of the plan")
            if name in available or tensors[name]["kind"] in ("input", "weight") or "value" in tensors[name]:
                raise Invalid(f"{path}.outputs[{i}]", f"{name!r} is already written (an input, a weight or "
                                                      "an earlier layer's output)")
            available.add(name)
        _stamps_agree(layer, path, tensors)
    for i, name in enumerate(doc["outputs"]):
        if name not in available:
            raise Invalid(f"outputs[{i}]", f"{name!r} is written by no layer")


#: what the builder stamps on a layer per input/output: (layer key, names key, tensor key, value of "")
_STAMPS = (("in_dtypes", "inputs", "dtype", ""), ("out_dtypes", "outputs", "dtype", ""),
           ("in_shapes", "inputs", "shape", []), ("out_shapes", "outputs", "shape", []))


def _stamps_agree(layer: Doc, path: str, tensors: Doc) -> None:
    """The dtypes/shapes stamped on a layer (tactics read them) are its tensors' own."""
    for key, names_key, tensor_key, omitted in _STAMPS:
        stamped = layer.get(key) or []
        if stamped and len(stamped) != len(layer[names_key]):
            raise Invalid(f"{path}.{key}", f"has {len(stamped)} items for {len(layer[names_key])} {names_key}")
        for i, (value, name) in enumerate(zip(stamped, layer[names_key])):
            if value != (tensors[name][tensor_key] if name else omitted):
                raise Invalid(f"{path}.{key}[{i}]", f"{show(value)} differs from the {tensor_key} of {name!r}")


def _arena(doc: Doc, weights_len: int) -> None:
    memory = doc["memory"]
    arena = memory["arena_bytes"]
    placed = memory.get("placements", {})
    alignment = memory.get("alignment", ALIGNMENT)
    if alignment & (alignment - 1) or alignment < ALIGNMENT:
        raise Invalid("memory.alignment", f"{alignment} is not a power of two >= {ALIGNMENT}")
    for name, t in doc["tensors"].items():
        if t["kind"] == "weight":
            continue
        path = f"tensors[{name!r}].offset"
        if t["offset"] < 0:
            raise Invalid(path, "is negative: the tensor has no place in the arena")
        if t["offset"] % alignment and name not in placed:  # a placed tensor: _placements checks its offset
            raise Invalid(path, f"{t['offset']} is not a multiple of {alignment}")
        if t["offset"] + t["nbytes"] > arena:
            raise Invalid(path, f"bytes {t['offset']}..{t['offset'] + t['nbytes']} lie outside the arena "
                                f"({arena} bytes)")
        if memory["offsets"].get(name) != t["offset"]:
            raise Invalid(f"memory.offsets[{name!r}]", f"{show(memory['offsets'].get(name))} differs from the "
                                                       f"tensor's offset {t['offset']}")
    for name in memory["offsets"]:
        if name not in doc["tensors"] or doc["tensors"][name]["kind"] == "weight":
            raise Invalid(f"memory.offsets[{name!r}]", "names no activation, input or output of the plan")


def _placements(doc: Doc, weights_len: int) -> None:
    """Each placed tensor (memory.placements) is one input of the Concat writing its root, read
    once by it and by no other Concat nor view (other readers read it at its rows: the runtime's
    tactic check asks their tactics), static, placed at exactly its slice of the root (polykit.compiler.plan.memory.
    concat_rows) and at the root's offset plus that slice's; or the source of such an input that
    is a view (memory.aliases), read by the view alone and placed as it is. Roots are activations,
    no view, placement or shape value; so the placed rows lie inside the root's slot and never
    overlap."""
    placements = doc["memory"].get("placements", {})
    if not placements:
        return
    tensors, aliases = doc["tensors"], doc["memory"].get("aliases", {})
    writer = {name: layer for layer in doc["layers"] for name in layer["outputs"] if name}
    readers: dict[str, list[str]] = {}
    kinds = {layer["name"]: layer["kind"] for layer in doc["layers"] if not layer.get("domain")}
    for layer in doc["layers"]:
        for name in layer["inputs"]:
            readers.setdefault(name, []).append(layer["name"])
    views = {src: [v for v in aliases if aliases[v] == src] for src in set(aliases.values())}
    for name, p in placements.items():
        path = f"memory.placements[{name!r}]"
        root = p["root"]
        view = name if name in aliases else None
        for who, what in ((name, "placed tensor"), (root, "root")):
            t = tensors.get(who)
            shared = who in aliases and (who != name or placements.get(aliases[who]) != p)
            if t is None or t["kind"] != "activation" or t.get("dims") or t.get("value") or shared:
                raise Invalid(path, f"the {what} {who!r} is no activation of a static shape outside every view "
                                    "(a placed view's source is placed as it is)")
        if root in placements:
            raise Invalid(path, f"its root {root!r} is placed itself: placements do not chain")
        concat = writer.get(root)
        if concat is None or concat["kind"] != "Concat" or concat.get("domain"):
            raise Invalid(path, f"{root!r} is not the output of a Concat")
        member = name
        if name not in concat["inputs"]:  # the source of a placed view the Concat reads
            placed_views = [v for v in views.get(name, []) if placements.get(v) == p]
            if len(placed_views) != 1 or readers.get(name) != [writer[placed_views[0]]["name"]]:
                raise Invalid(path, f"{name!r} is neither an input of {root!r}'s Concat nor the source of one "
                                    "placed view of it that alone reads it")
            member = placed_views[0]
            if readers.get(member) != [concat["name"]]:
                raise Invalid(path, f"the placed view {member!r} is read by more than its Concat {concat['name']!r}")
        elif views.get(name):
            raise Invalid(path, f"{name!r} has views ({', '.join(sorted(views[name]))}), which would read its rows "
                                "as contiguous bytes")
        others = [who for who in readers.get(member, []) if who != concat["name"]]
        if concat["inputs"].count(member) != 1 or any(kinds.get(who) == "Concat" for who in others):
            raise Invalid(path, f"{member!r} is not read exactly once by its Concat {concat['name']!r} and by no "
                                "other Concat")
        t, r = tensors[name], tensors[root]
        if t["dtype"] != r["dtype"] or (view and t["nbytes"] != tensors[aliases[view]]["nbytes"]):
            raise Invalid(path, f"{t['dtype']} tensor placed in a {r['dtype']} root (or a view of other bytes)")
        shape, axis = r["shape"], concat.get("attrs", {}).get("axis", 0)
        if not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
            raise Invalid(path, f"its Concat's axis {show(axis)} is outside the root's rank")
        axis %= len(shape)
        starts = [0]
        for each in concat["inputs"]:
            starts.append(starts[-1] + (tensors[each]["shape"][axis] if each and len(tensors[each]["shape"]) > axis
                                        else 0))
        i = concat["inputs"].index(member)
        want = concat_rows(shape, axis, starts[i], starts[i + 1] - starts[i])
        if (p["offset"], p["row"], p["stride"]) != want:
            raise Invalid(path, f"(offset, row, stride) {[p['offset'], p['row'], p['stride']]} is not its slice "
                                f"{list(want)} of {root!r}")
        if t["offset"] != r["offset"] + p["offset"] * nbytes_of(t["dtype"], [1]):
            raise Invalid(f"tensors[{name!r}].offset", f"{t['offset']} is not its root's offset plus its slice's")


def _lifetimes(doc: Doc, weights_len: int) -> None:
    tensors, lifetimes = doc["tensors"], doc["memory"]["lifetimes"]
    end = len(doc["layers"])
    uses: dict[str, list[int]] = {n: [] for n, t in tensors.items() if t["kind"] != "weight"}
    for idx, layer in enumerate(doc["layers"]):
        for name in list(layer["inputs"]) + list(layer["outputs"]):
            if name in uses:
                uses[name].append(idx)
    for name in host_written(doc):
        uses[name].append(-1)
    for name in doc["outputs"]:
        uses[name].append(end)
    for name in lifetimes:
        if name not in uses:
            raise Invalid(f"memory.lifetimes[{name!r}]", "names no activation, input or output of the plan")
    for name, steps in uses.items():
        path = f"memory.lifetimes[{name!r}]"
        if name not in lifetimes:
            raise Invalid(path, "is missing: every input, output and activation needs a lifetime")
        first, last = lifetimes[name]
        if not -1 <= first <= last <= end:
            raise Invalid(path, f"[{first}, {last}] is not an interval within [-1, {end}]")
        if steps and (first > min(steps) or last < max(steps)):
            raise Invalid(path, f"[{first}, {last}] does not cover the layers that use it ({min(steps)}..{max(steps)})")
    _no_shared_bytes(tensors, _slot_lifetimes(doc, tensors, lifetimes))


def _slot_lifetimes(doc: Doc, tensors: Doc, lifetimes: Doc) -> dict[str, tuple[int, int]]:
    """Lifetimes of the arena slots: a view (memory.aliases) shares its source's slot, which
    then lives until the view's last step; a placed tensor (memory.placements, checked by
    _placements) its root's, which then lives from the tensor's first step. Checks that each
    view is one: same offset and bytes as a source that is itself no view, neither of them a
    weight nor the view an engine input or output."""
    aliases = doc["memory"].get("aliases", {})
    placements = doc["memory"].get("placements", {})
    io = set(doc["inputs"]) | set(doc["outputs"])
    slots = {n: tuple(v) for n, v in lifetimes.items() if n not in aliases and n not in placements}
    for name, p in placements.items():
        first, last = slots[p["root"]]
        slots[p["root"]] = (min(first, lifetimes[name][0]), max(last, lifetimes[name][1]))
    for view, src in aliases.items():
        path = f"memory.aliases[{view!r}]"
        if view not in lifetimes or (src not in slots and src not in placements) or view in io:
            raise Invalid(path, f"{view!r} -> {src!r} is not a view of one activation by another")
        if (tensors[view]["offset"], tensors[view]["nbytes"]) != (tensors[src]["offset"], tensors[src]["nbytes"]):
            raise Invalid(path, "a view must have its source's offset and byte size")
        slot = placements[src]["root"] if src in placements else src  # a placed source: its root's slot
        first, last = slots[slot]
        slots[slot] = (min(first, lifetimes[view][0]), max(last, lifetimes[view][1]))
    return slots


def _no_shared_bytes(tensors: Doc, lifetimes: Doc) -> None:
    """No two arena slots alive at the same layer step may share bytes (a sweep over steps
    keeping the live byte ranges sorted: a new range only needs checking against neighbours)."""
    births: dict[int, list[str]] = {}
    for name, (first, _) in lifetimes.items():
        if tensors[name]["nbytes"]:
            births.setdefault(first, []).append(name)
    live: list[tuple[int, int, str]] = []  # (start, end, name), sorted, disjoint
    for step in sorted(births):
        live = [r for r in live if lifetimes[r[2]][1] >= step]
        for name in sorted(births[step]):
            start = tensors[name]["offset"]
            item = (start, start + tensors[name]["nbytes"], name)
            pos = bisect.bisect_left(live, item)
            for other in live[max(pos - 1, 0): pos + 1]:
                if other[0] < item[1] and item[0] < other[1]:
                    raise Invalid(f"tensors[{name!r}].offset", f"its bytes overlap {other[2]!r}'s while both are live "
                                                               f"(layer step {step})")
            live.insert(pos, item)


def _kernel_table(doc: Doc, weights_len: int) -> None:
    table = doc["metadata"].get("kernels")
    layer_names = {layer["name"] for layer in doc["layers"]}
    if table is None:
        if doc["target"] == "cuda" and layer_names:
            raise Invalid("metadata.kernels", "is missing: a cuda plan records the kernels of every layer")
        return
    for layer, rows in table["layers"].items():
        if layer not in layer_names:
            raise Invalid(f"metadata.kernels.layers[{layer!r}]", "names no layer of the plan")
        for i, row in enumerate(rows):
            if "key" not in row and doc["format"] >= 2:
                raise Invalid(f"metadata.kernels.layers[{layer!r}][{i}].key", "is missing")
    if doc["target"] == "cuda":
        missing = sorted(layer_names - set(table["layers"]))
        if missing:
            raise Invalid(f"metadata.kernels.layers[{missing[0]!r}]", "is missing: the layer's kernels are not recorded")


def drop_code_table(doc: Any) -> Any:
    """A format-1 document (its kernel table held CUDA source: a code table, `code_ref`, `file` and
    `defines` rows) with that source dropped: each row keeps its kernel's name, and the runtime
    regenerates the sources from the layers' tactics (polykit.runtime.tactic_check) as it does for
    a format-2 plan, so no text of the old table reaches NVRTC. Other documents are returned as
    they are; nothing here trusts the document's shape (the schema check comes next)."""
    if not isinstance(doc, dict) or doc.get("format") != 1:
        return doc
    metadata = doc.get("metadata")
    table = metadata.get("kernels") if isinstance(metadata, dict) else None
    if not isinstance(table, dict) or not isinstance(table.get("layers"), dict):
        return doc
    layers = {name: [{"name": row.get("name")} if isinstance(row, dict) else row for row in rows]
              if isinstance(rows, list) else rows for name, rows in table["layers"].items()}
    return {**doc, "metadata": {**metadata, "kernels": {"layers": layers}}}


def _input_values(doc: Doc, weights_len: int) -> None:
    for name, bound in (doc["metadata"].get("input_values") or {}).items():
        path = f"metadata.input_values[{name!r}]"
        t = doc["tensors"].get(name)
        if name not in doc["inputs"] or t is None:
            raise Invalid(path, f"{name!r} is not an engine input")
        if bound["dtype"] != t["dtype"] or bound["shape"] != t["shape"]:
            raise Invalid(path, f"{bound['dtype']}{bound['shape']} differs from the input's {t['dtype']}{t['shape']}")
        try:
            values = np.asarray(bound["values"], dtype=bound["dtype"])
        except (TypeError, ValueError, OverflowError) as exc:
            raise Invalid(f"{path}.values", f"are not {bound['dtype']} numbers ({exc})") from None
        if values.shape != (nbytes_of(bound["dtype"], bound["shape"]) // values.dtype.itemsize,):
            raise Invalid(f"{path}.values", f"has shape {values.shape}, not the input's element count")


def _body_outputs(doc: Doc, weights_len: int) -> None:
    """A control-flow body's plan lists its outputs in the body's order (polykit.compiler.builder.bodies)."""
    for i, name in enumerate(doc["metadata"].get("body_outputs") or ()):
        if name not in doc["outputs"]:
            raise Invalid(f"metadata.body_outputs[{i}]", f"{name!r} is not an output of the plan")


def _collectives(doc: Doc, weights_len: int) -> None:
    """The plan's rank is one of its ranks; every collective layer's attributes are valid for its
    input (polykit.compiler.ops.models.collective) and name ranks of the plan's group."""
    from polykit.compiler.ir.graph import POLYKIT_DOMAIN
    from polykit.compiler.ops.models.collective import KIND, attr_problem, group_of

    meta = doc["metadata"]
    ranks = meta.get("ranks", 1)
    if meta.get("rank", 0) >= ranks:
        raise Invalid("metadata.rank", f"{meta['rank']} is not below metadata.ranks {ranks}")
    for layer in doc["layers"]:
        if layer["kind"] != KIND or layer.get("domain") != POLYKIT_DOMAIN:
            continue
        path = f"layers[{layer['name']!r}].attrs"
        x = layer["inputs"][0] if layer["inputs"] else ""
        problem = attr_problem(layer["attrs"], len(doc["tensors"][x]["shape"]) if x in doc["tensors"] else None)
        if problem is None and max(group_of(layer["attrs"])) >= ranks:
            problem = f"group {list(group_of(layer['attrs']))} names ranks the plan's {ranks} do not have"
        if problem:
            raise Invalid(path, problem)


def check_profile_tactics(doc: Doc, weights_len: int) -> None:
    """A layer's profile_tactics (polykit.kernels.profile_tactics) is one tactic name per profile,
    starting with its `tactic` and naming two or more tactics (that each exists for the layer's
    kind is the runtime's question: polykit.runtime.tactic_check)."""
    profiles = doc.get("profiles")
    count = len(profiles["ranges"]) if profiles is not None else 1
    for layer in doc["layers"]:
        names = layer.get("profile_tactics")
        if names is None:
            continue
        path = f"layers[{layer['name']!r}].profile_tactics"
        if len(names) != count:
            raise Invalid(path, f"names {len(names)} tactics; the plan has {count} optimization profile(s)")
        if names[0] != layer["tactic"]:
            raise Invalid(f"{path}[0]", f"{names[0]!r} differs from the layer's tactic {layer['tactic']!r} "
                                        "(profile 0's)")
        if len(set(names)) < 2:
            raise Invalid(path, "names one tactic for every profile (a plan leaves the field out then)")


#: every rule over the whole document, in order (each assumes the ones before it passed)
RULES: tuple[Callable[[Doc, int], None], ...] = (
    _tensor_sizes, check_dims, _weights, _io, _layer_io, _arena, _placements, _lifetimes, _kernel_table, _input_values,
    _body_outputs, _collectives, check_profile_tactics,
)


# ---- the layers against the op registry ---------------------------------------------------------
def check_layers(plan: Any, where: str = "plan") -> None:
    """PlanError when a layer fails its op's shape rule or disagrees with the plan's tensors."""
    try:
        _shapes_agree(plan)
    except Invalid as bad:
        raise plan_error(bad, where) from None


def _shapes_agree(plan: Any) -> None:
    from polykit.compiler.graph.infer import infer_shapes
    from polykit.compiler.ir.graph import Graph, Value
    from polykit.compiler.ir.symbolic import evaluate
    from polykit.compiler.ops.data_dims import sized_tensors

    host = [n for n, t in plan.tensors.items() if t.value]
    values = {n: Value(n, plan.tensors[n].np_dtype, tuple(plan.tensors[n].shape)) for n in list(plan.inputs) + host}
    bound = {n: np.asarray(v["values"], dtype=v["dtype"]).reshape(v["shape"])
             for n, v in (plan.metadata.get("input_values") or {}).items()}
    if plan.profiles is not None:  # shape-tensor inputs at the first profile's opt
        opt = plan.profiles.corners()[1][2]
        bound.update({n: np.asarray([opt[s] if isinstance(s, str) else s for s in syms], plan.tensors[n].np_dtype)
                      .reshape(plan.tensors[n].shape) for n, syms in plan.profiles.values.items()})
    if host:  # shape tensors the engine writes: their values at the first profile's opt
        opt = plan.profiles.corners()[1][2]
        bound.update({n: np.asarray([evaluate(v, opt) for v in plan.tensors[n].value], plan.tensors[n].np_dtype)
                      .reshape(plan.tensors[n].shape) for n in host})
    weights = {n: plan.weights[n] for n, t in plan.tensors.items() if t.kind == "weight"}
    nodes = [_dense_view(layer_as_node(layer), plan.tensors, weights) for layer in plan.layers]
    graph = Graph(nodes, list(plan.inputs) + host, plan.outputs, weights, values, metadata={"input_values": bound})
    try:
        infer_shapes(graph, strict=True)
    except UnsupportedModelError as exc:
        name, op, domain, _ = exc.unsupported[0]
        raise Invalid(f"layers[{name!r}].kind", f"{op!r} (domain {domain or 'ai.onnx'!r}) is an op this polykit does "
                                                "not know (a plugin's op needs the plugin installed)") from None
    except PolykitError as exc:
        failing = next((l for l in plan.layers if exc.where and f"node {l.name!r}" in exc.where), None)
        path = f"layers[{failing.name!r}]" if failing is not None else "layers"
        raise Invalid(path, f"fails its op's shape rule: {exc.what}") from None
    sized = sized_tensors(plan)  # their stored shapes stand in for what only the run decides
    for layer in plan.layers:
        for name in layer.outputs:
            if not name:
                continue
            desc, got = plan.tensors[name], graph.value(name)
            if got.dtype is not None and np.dtype(got.dtype).name != desc.dtype:
                raise Invalid(f"tensors[{name!r}].dtype", f"{desc.dtype!r}, but layer {layer.name!r} ({layer.kind}) "
                                                          f"gives {np.dtype(got.dtype).name}")
            if got.shape is not None and name not in sized and not _dims_agree(got.shape, desc.shape):
                raise Invalid(f"tensors[{name!r}].shape", f"{list(desc.shape)}, but layer {layer.name!r} "
                                                          f"({layer.kind}) gives {list(got.shape)}")


def _dense_view(node: Any, tensors: Any, weights: dict[str, Any]) -> Any:
    """A layer reading a compressed 2:4 weight (polykit.compiler.plan.sparse24) as its op sees
    it: reading a stand-in of the dense weight's shape and dtype (a broadcast, no memory), after
    its record is checked."""
    if ATTR not in node.attrs:
        return node
    blob = node.inputs[1] if len(node.inputs) > 1 else ""
    problem = record_problem(node.attrs[ATTR], tensors[blob].nbytes if blob in tensors else None)
    if problem:
        raise Invalid(f"layers[{node.name!r}].attrs.{ATTR}", problem)
    record = node.attrs[ATTR]
    stand_in = f"{blob}#dense"
    weights[stand_in] = np.broadcast_to(np.zeros((), record["dtype"]), tuple(record["shape"]))
    node.inputs = [node.inputs[0], stand_in, *node.inputs[2:]]
    return node


def _dims_agree(inferred: tuple, stored: tuple) -> bool:
    return len(inferred) == len(stored) and all(not isinstance(a, int) or a == b for a, b in zip(inferred, stored))
