"""Programmatic Dependent Launch (Hopper, sm_90+): kernel sources instrumented at render time.

A kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may start while the
kernel before it on the stream still runs: its blocks are scheduled once every block of that
kernel has executed `griddepcontrol.launch_dependents` (or exited), so its launch latency and
prologue overlap the predecessor's tail. Such a kernel must execute `griddepcontrol.wait`, which
returns once the predecessor grid has completed and its memory is flushed, before it touches
global memory. `instrument` makes the first statement of every `__global__` function of a
rendered source `PK_PDL_ENTRY();`, which (PREAMBLE) waits and then lets this kernel's own
dependents be scheduled: the wait comes first, so nothing a kernel does can race the kernels
before it; the trigger right after it is sound because a dependent waits in its own
`griddepcontrol.wait` for this grid's completion and flush. Every kernel waiting makes the chain
transitive: a kernel completes only after the one before it completed.

A kernel that reads plan weights before anything else may wait later itself: its body's first
statement is `PK_PDL_DEFER();` (then no ENTRY is inserted) and it calls `PK_PDL_WAIT();` (the
same wait and trigger) before its first access to memory that is not a plan weight. Plan weights
are written only by uploads and refits (the host waits for the device first) and by weight
streaming's copies, which the launch reading them waits for in full (an ordinary stream or event
dependency: programmatic serialization relaxes only the dependency on the kernel before), so the
early reads see what a waiting kernel would. The weight-only GEMMs do this (weight_only_mma*.cu):
their packed weights, the long pole at small M, stream in while the kernel before finishes.
src/pdl.cuh defines both macros as no-ops for sources rendered without PDL.

A source is instrumented whole or not at all: `instrument` returns None when any `__global__` of
the text is not a function definition it parses (in a form polykit's kernels use: specifiers,
`__launch_bounds__(...)`, a name, possibly `##`-pasted inside a macro, a parameter list, then
the body's `{`), and the launcher gives the launch attribute only to kernels of instrumented units
(polykit.runtime.cuda.launcher): an uninstrumented kernel launches as before. A source rendered
without PDL (KernelSource.render) is unchanged, byte for byte: its cache key and cubin too.
"""

from __future__ import annotations

import re

#: the macro call inserted right after the opening brace of every kernel
ENTRY = "PK_PDL_ENTRY();"

#: what an instrumented source starts with (after its #defines): PK_PDL, and the entry macro, which
#: waits for the grids this one depends on and then triggers its dependents; a no-op below sm_90
PREAMBLE = """#define PK_PDL 1
#if defined(PK_PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PK_PDL_ENTRY() do { asm volatile("griddepcontrol.wait;" ::: "memory"); \\
                            asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); } while (0)
#else
#define PK_PDL_ENTRY() do { } while (0)
#endif
#define PK_PDL_WAIT() PK_PDL_ENTRY()
#define PK_PDL_DEFER() do { } while (0)
"""

#: a kernel body's first statement that says the kernel calls PK_PDL_WAIT() itself (no ENTRY inserted)
DEFER = "PK_PDL_DEFER"

#: the first arch whose kernels can wait on their launch dependencies (griddepcontrol, PTX 7.8)
MIN_ARCH = 90

#: what a kernel's text need not be read for: comments, string and character literals, and numbers
#: with digit separators (whose ' is no character literal); the leftmost match wins, as a lexer reads
_OPAQUE = re.compile(r"""
    (?=[/"'uULR0-9])  # (a quick test first: most characters start none of them)
    (?: //[^\n]*
  | /\*.*?\*/
  | (?:u8|[uUL])?R"(?P<delim>[^()\\\s"]{0,16})\(.*?\)(?P=delim)"
  | (?:u8|[uUL])?"(?:[^"\\\n]|\\.)*"
  | (?:u8|[uUL])?'(?:[^'\\\n]|\\.)*'
  | (?<![A-Za-z0-9_.])[0-9][A-Za-z0-9_.]*'[A-Za-z0-9_.']* )
""", re.X | re.S)
#: a character of masked text: anything but a line break or a line splice becomes a space
_MASKED = re.compile(r"[^\n\\]|\\(?!\r?\n)")
_GLOBAL = re.compile(r"(?<![A-Za-z0-9_])__global__(?![A-Za-z0-9_])")
#: one lexeme of a kernel's declarator: space, a line splice, a line break, `##`, a word, one character
_DECLARATOR = re.compile(r"(?P<space>[ \t\f\v\r]+|\\\r?\n)|(?P<newline>\n)|(?P<word>##|[A-Za-z0-9_]+)|(?P<char>.)", re.S)
_DIRECTIVE = re.compile(r"[ \t]*#[ \t]*(?P<name>[A-Za-z_]*)")


def supports_pdl(arch: str) -> bool:
    """Whether a device of `arch` ("sm_90", "sm_90a", "sm_100") runs programmatic dependent launches."""
    m = re.fullmatch(r"sm_([0-9]+)[a-z]?", arch or "")
    return m is not None and int(m.group(1)) >= MIN_ARCH


class _Unparsed(Exception):
    """The text has a form the kernel parser does not follow (the source is left plain)."""


def _mask(text: str) -> str:
    """`text` with its comments and literals blanked out (same length, line breaks and splices
    kept), so what is left to search is code and preprocessor directives."""
    def blank(m: re.Match) -> str:
        if m.group(0).startswith("//") and m.group(0).rstrip("\r").endswith("\\"):
            raise _Unparsed("a // comment continued onto the next line")
        return _MASKED.sub(" ", m.group(0))

    masked = _OPAQUE.sub(blank, text)
    if "/*" in masked:
        raise _Unparsed("an unterminated /* comment")
    return masked


def _line_start(masked: str, at: int) -> int:
    """The offset where the logical line holding offset `at` starts (line splices followed back)."""
    start = masked.rfind("\n", 0, at) + 1
    while start > 0 and (masked[start - 2:start - 1] == "\\" or masked[start - 3:start - 1] == "\\\r"):
        start = masked.rfind("\n", 0, start - 1) + 1
    return start


def _kernel_body(masked: str, at: int) -> int:
    """The offset just past the `{` opening the body of the kernel whose `__global__` starts at
    `at` in `masked`; _Unparsed unless a function definition of the expected form follows (words,
    balanced parenthesized groups, the last one its parameter list), all in one #define or outside
    preprocessor directives."""
    directive = _DIRECTIVE.match(masked, _line_start(masked, at))
    if directive and directive.group("name") != "define":
        raise _Unparsed("a __global__ in a preprocessor directive")
    in_define = directive is not None
    i, depth, groups, last = at + len("__global__"), 0, 0, ""
    while i < len(masked):
        m = _DECLARATOR.match(masked, i)
        kind, tok, i = m.lastgroup, m.group(0), m.end()
        if kind == "space":
            continue
        if kind == "newline":
            if in_define:
                raise _Unparsed("a kernel whose #define ends before its body")
            if _DIRECTIVE.match(masked, i):
                raise _Unparsed("a kernel declarator interrupted by a preprocessor directive")
            continue
        if depth:
            depth += (tok == "(") - (tok == ")")
            if depth == 0:
                groups, last = groups + 1, ")"
        elif tok == "(":
            depth = 1
        elif tok == "{":
            if last != ")" or groups == 0:
                raise _Unparsed("a __global__ whose body does not follow a parameter list")
            return i
        elif kind == "word":
            last = tok
        else:  # a template, a declaration (;), an operator: not a form handled here
            raise _Unparsed(f"a __global__ declaration with {tok!r} before its body")
    raise _Unparsed("a __global__ without a body")


def defers(masked: str, body: int) -> bool:
    """Whether the kernel whose body opens at offset `body` of `masked` (_mask's text) starts with DEFER."""
    return masked[body:].lstrip().startswith(DEFER)


def instrument(text: str) -> str | None:
    """`text` (a rendered kernel source) with ENTRY inserted right after the opening brace of every
    `__global__` function but those whose body starts with DEFER, and nothing else changed; None when it has no kernel or a `__global__`
    this parser does not follow (the source is then compiled and launched without PDL)."""
    try:
        masked = _mask(text)
        cuts = [_kernel_body(masked, m.start()) for m in _GLOBAL.finditer(masked)]
    except _Unparsed:
        return None
    if not cuts:
        return None
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(text[start:cut])
        if not defers(masked, cut):
            pieces.append(ENTRY)
        start = cut
    pieces.append(text[start:])
    return "".join(pieces)
