"""Concatenated operands of the pointwise kernels (pass absorb_concat; the format:
polykit.compiler.ops.nn.concat_operands).

A Pointwise layer may read one of its body's values as the concatenation of several sources
along an axis, without the Concat's buffer. Its kernels take, for that logical input i, one
pointer per source (`x<i>_<s>`: the number of sources is part of the module, like the body) and
a table of runtime extents after the path's own geometry: `e<i>_<s>`, the elements of source s
in one slice of the outer dims (its size along the axis times the inner size), and `E<i>`, their
sum. Element o of the virtual concatenation (contiguous, the operand's logical shape) is element
(o / E) * e_s + r of the source s whose range holds r = o % E. So the declared kernels depend on
no stamped shape (docs/DYNAMIC_SHAPES.md "Tactics"). A vector load of V elements stays inside
one source when every e_s is a multiple of V and every source pointer is aligned to V elements
(`ConcatTensor.aligned`); the host takes the vector paths only then, the scalar ones otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from polykit.compiler.ops.nn.concat_operands import concat_operands, concat_shape, group_inputs, operand_positions
from polykit.kernels.cuda.base import DeviceTensor


def operand_counts(layer) -> dict[int, int]:
    """Logical input index -> number of sources, for a Pointwise layer's concatenated operands."""
    if layer.kind != "Pointwise" or not layer.attrs.get("concat"):
        return {}
    return {i: e["count"] for i, e in operand_positions(tuple(layer.inputs), layer.attrs).items()}


def input_params(ctype: str, i: int, count: int | None, restrict: str = "") -> list[str]:
    """The pointer parameters of logical input i: one, or one per source of a concatenated operand."""
    if count is None:
        return [f"const {ctype}* {restrict}x{i}"]
    return [f"const {ctype}* {restrict}x{i}_{s}" for s in range(count)]


def table_params(cats: Mapping[int, int]) -> list[str]:
    """The extents table of every concatenated operand (after the path's geometry)."""
    return [p for i in sorted(cats) for p in [f"i64 e{i}_{s}" for s in range(cats[i])] + [f"i64 E{i}"]]


def table_locals(tin: Sequence[str], cats: Mapping[int, int], pad: str) -> list[str]:
    """Each concatenated operand's pointers and extents as two local arrays (unrolled: registers)."""
    lines = []
    for i in sorted(cats):
        ps = ", ".join(f"x{i}_{s}" for s in range(cats[i]))
        es = ", ".join(f"e{i}_{s}" for s in range(cats[i]))
        lines.append(f"{pad}const {tin[i]}* const cp{i}[{cats[i]}] = {{{ps}}}; const i64 ce{i}[{cats[i]}] = {{{es}}};")
    return lines


def cat_load(i: int, width: str, offset: str) -> str:
    """C expression: the Vec<T, width> of logical input i at element `offset` of its concatenation."""
    return f"cat_vec<{width}>(cp{i}, ce{i}, E{i}, {offset})"


def concat_helpers() -> list[str]:
    """Device functions of a module with a concatenated operand (only such modules hold them, so
    the code of every other pointwise module stays as it was)."""
    return [
        "// element o of a concatenation: source s where o % E falls, slice o / E of it",
        "template <class T, int S>",
        "__device__ __forceinline__ const T* cat_ptr(const T* const (&p)[S], const i64 (&e)[S], i64 E, i64 o) {",
        "  const i64 q = o / E;",
        "  i64 r = o - q * E;",
        "#pragma unroll",
        "  for (int s = 0; s < S - 1; ++s) {",
        "    if (r < e[s]) return p[s] + q * e[s] + r;",
        "    r -= e[s];",
        "  }",
        "  return p[S - 1] + q * e[S - 1] + r;",
        "}",
        "template <int V, class T, int S>",
        "__device__ __forceinline__ Vec<T, V> cat_vec(const T* const (&p)[S], const i64 (&e)[S], i64 E, i64 o) {",
        "  return *reinterpret_cast<const Vec<T, V>*>(cat_ptr(p, e, E, o));",
        "}",
        "template <class T, int S>",
        "__device__ __forceinline__ typename Compute<T>::type cat_at(const T* const (&p)[S], const i64 (&e)[S], i64 E, i64 o) {",
        "  return ld(cat_ptr(p, e, E, o), 0);",
        "}",
        "",
    ]


@dataclass(frozen=True)
class ConcatTensor:
    """A concatenated operand at launch: its sources (device tensors) and axis."""

    sources: tuple[DeviceTensor, ...]
    axis: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(concat_shape([t.shape for t in self.sources], self.axis))

    @property
    def dtype(self) -> np.dtype:
        return self.sources[0].dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def extents(self) -> list[int]:
        """Elements of each source in one slice of the outer dims."""
        return [math.prod(t.shape[self.axis:]) for t in self.sources]

    def aligned(self, width: int) -> bool:
        """Whether a load of `width` elements at a multiple of `width` stays in one source, aligned."""
        step = width * self.dtype.itemsize
        return all(t.ptr % step == 0 for t in self.sources) and all(e % width == 0 for e in self.extents())


def logical_tensors(layer, tensors: Mapping[str, DeviceTensor]) -> list:
    """The layer's input tensors as its body reads them: a ConcatTensor per concatenated operand."""
    inputs = tuple(layer.inputs)
    entries = concat_operands(layer.attrs, len(inputs)) if layer.kind == "Pointwise" else []
    grouped = group_inputs(inputs, entries, lambda e, names: ConcatTensor(tuple(tensors[n] for n in names), e["axis"]))
    return [g if isinstance(g, ConcatTensor) else tensors[g] for g in grouped if g]


def logical_stamps(layer, values: Sequence, combine) -> list:
    """A stamped per-input list (in_shapes, in_dtypes) as the logical inputs: each operand's
    sources become `combine(axis, their values)`."""
    entries = concat_operands(layer.attrs, len(layer.inputs)) if layer.kind == "Pointwise" else []
    return group_inputs(list(values), entries, lambda e, vs: combine(e["axis"], vs))


def vector_aligned(t, width: int) -> bool:
    """Whether tensor (or concatenated operand) `t` takes loads of `width` elements."""
    if isinstance(t, ConcatTensor):
        return t.aligned(width)
    return t.ptr % (width * t.dtype.itemsize) == 0


def pointer_args(x: Sequence) -> list:
    """The launch's input pointers: a concatenated operand's sources in order."""
    return [s for t in x for s in (t.sources if isinstance(t, ConcatTensor) else (t,))]


def table_args(x: Sequence) -> list[int]:
    """The extents tables of the concatenated operands (table_params' order)."""
    out: list[int] = []
    for t in x:
        if isinstance(t, ConcatTensor):
            ext = t.extents()
            out += [*ext, sum(ext)]
    return out


def compile_variants():
    """None of its own: cuda.pointwise's compile_variants compile the concat modules
    (pointwise.concat_variant_layers)."""
    return []
