"""The op tables the compiler looks up: importers (per op and opset) and shape rules.

Adding an op means: an `@importer` where its ONNX form changed across opsets (to bring
every version to the one canonical form the rest of polykit knows), a `@shape_rule`
(output dtypes and shapes), and a reference kernel (`polykit.compiler.ops.references.reference`).
The tables are filled through the `polykit_ops` plugin hook (`load_ops`): polykit's own
ops come from the built-in plugin (polykit.kernels.builtin), which imports the op modules
whose decorators are these functions, and a plugin calls the same functions through the
OpRegistry its hook receives. A second, different function for a taken (op, domain[,
opset]) is a PluginError.

Canonical form: after import, every node follows the semantics of the graph's opset,
which is at least CANONICAL_OPSET. Importers for older versions rewrite the node (move
attributes to inputs, rename, replace by other ops) so nothing downstream needs to know
which opset a model came from.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from polykit.compiler.ir.graph import Dim, Graph, Node, Shape, Value
from polykit.compiler.ir.symbolic import SymInt
from polykit.errors import NodeAttributeError, ShapeError

#: Nodes are brought to (at least) this default-domain opset on import.
CANONICAL_OPSET = 21

OpKey = tuple[str, str]  # (domain, op_type); domain "" is ai.onnx

ImporterFn = Callable[[Node, "ImportContext"], "list[Node] | None"]
#: a shape rule gives each output's (dtype, shape), or its Value (sequences, optionals: wrap)
ShapeRuleFn = Callable[["InferContext"], "list[tuple[np.dtype | None, Shape] | Value]"]

IMPORTERS: dict[OpKey, list[tuple[int, ImporterFn]]] = {}
SHAPE_RULES: dict[OpKey, ShapeRuleFn] = {}


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def refuse_duplicate(have: Any, fn: Any, what: str) -> bool:
    """True when `fn` is already registered (`have` is it); PluginError when another is."""
    if have is None:
        return False
    if have is fn:
        return True
    from polykit.plugins import PluginError

    raise PluginError(f"two {what}s are registered ({_qualname(have)} and {_qualname(fn)})",
                      hint="an op has one importer per opset, one shape rule and one reference kernel; "
                           "give the plugin's op its own domain")


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def importer(op_type: str, since: int = 1, domain: str = "") -> Callable[[ImporterFn], ImporterFn]:
    """Register `fn(node, ctx)` to canonicalize `op_type` nodes from models whose opset is
    >= `since` (and below the next registered `since`). It edits the node in place and
    returns None, or returns the list of nodes that replace it."""

    def register(fn: ImporterFn) -> ImporterFn:
        entries = IMPORTERS.setdefault((_norm_domain(domain), op_type), [])
        have = next((f for s, f in entries if s == since), None)
        if not refuse_duplicate(have, fn, f"importer of {domain or 'ai.onnx'}::{op_type} (opset {since})"):
            entries.append((since, fn))
            entries.sort(key=lambda e: e[0])
        return fn

    return register


def find_importer(domain: str, op_type: str, opset: int) -> ImporterFn | None:
    best = None
    for since, fn in IMPORTERS.get((_norm_domain(domain), op_type), []):
        if since <= opset:
            best = fn
    return best


def shape_rule(*op_types: str, domain: str = "") -> Callable[[ShapeRuleFn], ShapeRuleFn]:
    """Register `fn(ctx) -> [(dtype, shape), ...]` (one per output) for the given ops."""

    def register(fn: ShapeRuleFn) -> ShapeRuleFn:
        for op in op_types:
            key = (_norm_domain(domain), op)
            if not refuse_duplicate(SHAPE_RULES.get(key), fn, f"shape rule of {domain or 'ai.onnx'}::{op}"):
                SHAPE_RULES[key] = fn
        return fn

    return register


def find_shape_rule(domain: str, op_type: str) -> ShapeRuleFn | None:
    load_ops()
    return SHAPE_RULES.get((_norm_domain(domain), op_type))


class OpRegistry:
    """What the `polykit_ops` hook receives: the decorators that register an op.

        @hookimpl
        def polykit_ops(registry):
            registry.shape_rule("MyOp", domain="my.domain")(my_shape_rule)
            registry.reference("MyOp", domain="my.domain")(my_reference_kernel)
    """

    importer = staticmethod(importer)
    shape_rule = staticmethod(shape_rule)

    @staticmethod
    def reference(*op_types: str, domain: str = "") -> Callable[[Any], Any]:
        from polykit.compiler.ops.references import reference

        return reference(*op_types, domain=domain)


_loaded_for: Any = None
_load_lock = threading.RLock()


def load_ops() -> None:
    """Fill the op tables through the `polykit_ops` hook of every plugin (built-ins first),
    once per plugin manager: build_plan() from Python sees plugin ops as the CLI does."""
    global _loaded_for
    from polykit.plugins import plugin_manager

    pm = plugin_manager()
    if _loaded_for is pm:
        return
    with _load_lock:
        if _loaded_for is not pm:
            pm.hook.polykit_ops(registry=OpRegistry())
            _loaded_for = pm


def is_supported(domain: str, op_type: str) -> bool:
    from polykit.compiler.ops.references import find_reference

    return find_shape_rule(domain, op_type) is not None and find_reference(domain, op_type) is not None


_REQUIRED = object()


#: (GraphProto, where, captured outer names) -> the canonical Graph of a subgraph of the model
GraphImporter = Callable[[Any, str, Sequence[str]], Graph]


@dataclass
class ImportContext:
    """What an importer may use: the graph being built, the model's original opset, and
    `import_graph(proto, where, captures)`, which turns a subgraph (a control-flow body, a
    FlexAttention modifier) into a canonical Graph of the model's opsets whose reads of the
    enclosing scope, `captures`, are extra inputs after its own (polykit.compiler.graph.onnx_import
    supplies it: the importer of the model is the importer of its subgraphs)."""

    graph: Graph
    opset: int  # the model's original default-domain opset
    import_graph: GraphImporter
    #: tensors an importer made that its later nodes of the same graph may read instead of making
    #: them again, under keys of the importer's choosing (the com.microsoft attention ops' mask,
    #: one for all the layers that read the same mask input: ops/models/attention_ms.py)
    made: dict[Any, str] = field(default_factory=dict)

    def add_constant(self, array: Any, prefix: str = "const", dtype: Any = None) -> str:
        """Add an initializer and return its name (for moving an attribute to an input)."""
        return self.graph.add_initializer(np.asarray(array, dtype=dtype), prefix)

    def const(self, name: str) -> np.ndarray | None:
        return self.graph.initializers.get(name) if name else None


class InferContext:
    """What a shape rule sees of one node: input metadata, constant inputs, attributes."""

    def __init__(self, node: Node, dtypes: Sequence[np.dtype | None], shapes: Sequence[Shape],
                 consts: Sequence[np.ndarray | None], values: Sequence[Value] = (), data_dims: bool = False):
        self.node = node
        self.data_dims = data_dims  # a build: data-dependent dims become DataDims (polykit.compiler.ops.data_dims)
        self._dtypes = list(dtypes)
        self._shapes = list(shapes)
        self._consts = list(consts)
        self._values = list(values)

    @property
    def n_inputs(self) -> int:
        return len(self.node.inputs)

    @property
    def n_outputs(self) -> int:
        return len(self.node.outputs)

    def has(self, i: int) -> bool:
        """Whether optional input i is present."""
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def dtype(self, i: int) -> np.dtype | None:
        return self._dtypes[i] if self.has(i) else None

    def shape(self, i: int) -> Shape:
        return self._shapes[i] if self.has(i) else None

    def value(self, i: int) -> Value:
        """Input i's whole metadata (wrap and per-element shapes of a sequence included)."""
        if i < len(self._values) and self.has(i):
            return self._values[i]
        return Value(self.node.input(i), self.dtype(i), self.shape(i))

    def rank(self, i: int) -> int | None:
        s = self.shape(i)
        return None if s is None else len(s)

    def const(self, i: int) -> np.ndarray | None:
        """The value of input i when it is known at build time (initializer or folded)."""
        return self._consts[i] if self.has(i) else None

    def attr(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self.node.attrs:
            return self.node.attrs[key]
        if default is _REQUIRED:
            raise NodeAttributeError(
                f"required attribute {key!r} is missing",
                where=self.node.describe(),
                hint="add the attribute to the node (see the ONNX operator spec)",
            )
        return default

    def fail(self, what: str, hint: str | None = None) -> "ShapeError":
        """Build a ShapeError about this node (use as `raise ctx.fail(...)`)."""
        return ShapeError(what, where=self.node.describe(), hint=hint)

    def normalize_axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            raise self.fail(f"axis {axis} is out of range for rank {rank}")
        return axis % rank if rank else 0


def broadcast_shapes(ctx: InferContext, *shapes: Shape) -> Shape:
    """Numpy-style broadcast of shapes with symbolic/unknown dims; ShapeError on a clash."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        result: Dim = 1
        for d in dims:
            if _is_one(d):
                continue
            if _is_one(result):
                result = d
            elif d == result:
                continue
            elif isinstance(d, int) and isinstance(result, int):
                raise ctx.fail(
                    f"cannot broadcast shapes {', '.join(str(tuple(s)) for s in shapes)} (dim {d} vs {result})",
                    hint="the inputs' shapes must be numpy-broadcastable",
                )
            elif isinstance(result, int) and not _is_one(result):
                pass  # symbolic d must equal result at run time
            elif isinstance(d, int):
                result = d
            else:
                result = None if result != d else result
        out.append(result)
    return tuple(out)


def _is_one(d: Dim) -> bool:
    """A static 1 (a SymInt that is 1 at opt is a dynamic dim, not a broadcast 1)."""
    return d == 1 and not isinstance(d, SymInt)
