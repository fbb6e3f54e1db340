"""PDL instrumentation at render time (polykit.kernels.cuda.pdl, KernelSource.with_pdl), no GPU:
every kernel polykit ships (every .cu file, every compile variant, generated code included) gets
`PK_PDL_ENTRY();` as the first statement of each `__global__` function (but a kernel whose body starts with
`PK_PDL_DEFER();`: it waits itself) and nothing else changes;
a source rendered without PDL is the text as before; forms the parser does not follow leave the
whole unit plain."""

from __future__ import annotations


import pytest

import polykit.kernels.cuda as cuda_kernels
from polykit.errors import DeviceError
from polykit.kernels.cuda.base import CUDA_DIR, KernelSource, inline_includes
from polykit.kernels.cuda.pdl import _GLOBAL, ENTRY, PREAMBLE, _kernel_body, _mask, defers, instrument, supports_pdl


def all_variants() -> list[KernelSource]:
    out: dict[str, KernelSource] = {}
    for source in cuda_kernels.all_compile_variants():
        out.setdefault(source.key(), source)
    return list(out.values())


def entries_first(instrumented: str) -> int:
    """How many `__global__` functions of `instrumented` start with ENTRY (all of them but those whose body
    starts with DEFER, or an AssertionError)."""
    masked = _mask(instrumented)
    entered = 0
    for m in _GLOBAL.finditer(masked):
        body = _kernel_body(masked, m.start())
        if defers(masked, body):
            assert ENTRY not in instrumented[body:body + len(ENTRY) + 8]
            continue
        assert instrumented[body:body + len(ENTRY)] == ENTRY, instrumented[m.start():body + 40]
        entered += 1
    return entered


def deferring(text: str) -> int:
    """How many `__global__` functions of `text` start with DEFER."""
    masked = _mask(text)
    return sum(defers(masked, _kernel_body(masked, m.start())) for m in _GLOBAL.finditer(masked))


def check_instrumented(text: str) -> str:
    out = instrument(text)
    assert out is not None
    assert out.replace(ENTRY, "") == text  # nothing but the entry calls added
    kernels = entries_first(out)
    assert kernels == out.count(ENTRY) == len(list(_GLOBAL.finditer(_mask(text)))) - deferring(text)
    assert kernels + deferring(text) > 0
    return out


@pytest.mark.parametrize("path", sorted(CUDA_DIR.glob("*.cu")), ids=lambda p: p.name)
def test_every_shipped_kernel_file_is_instrumented_entry_first(path):
    check_instrumented(inline_includes(path.read_text()))


def test_every_compile_variant_is_instrumented_entry_first():
    variants = all_variants()
    assert any(v.code is not None for v in variants)  # generated codes are among them
    kernels = 0
    for source in variants:
        pdl = source.with_pdl()
        assert pdl is not None, source.name
        text, plain = pdl.render(), source.render()
        head = "".join(f"#define {k} {v}\n" for k, v in source.defines)
        assert text == head + PREAMBLE + check_instrumented(plain[len(head):])
        kernels += entries_first(text)
    assert kernels >= len(variants)


def test_a_source_rendered_without_pdl_is_untouched():
    for source in all_variants()[:40]:
        plain = source.render()
        assert "PK_PDL" not in plain and ENTRY not in plain
        key = source.key()
        pdl = source.with_pdl()
        assert source.key() == key and pdl.key() != key and pdl.with_pdl() is pdl
        assert source.to_json() == {k: v for k, v in pdl.to_json().items() if k != "pdl"}
        assert KernelSource.from_json(pdl.to_json()) == pdl and KernelSource.from_json(source.to_json()) == source


def test_the_preamble_waits_then_triggers_only_with_pk_pdl_on_sm90():
    assert PREAMBLE.startswith("#define PK_PDL 1\n")
    guard, wait, trigger = (PREAMBLE.index(s) for s in ("__CUDA_ARCH__ >= 900", "griddepcontrol.wait;",
                                                         "griddepcontrol.launch_dependents;"))
    assert "defined(PK_PDL)" in PREAMBLE and guard < wait < trigger
    assert 'asm volatile("griddepcontrol.wait;" ::: "memory")' in PREAMBLE
    assert PREAMBLE.count("#define PK_PDL_ENTRY()") == 2  # the sm_90 one and the no-op below


@pytest.mark.parametrize("arch,ok", [("sm_90", True), ("sm_90a", True), ("sm_100", True), ("sm_120", True),
                                     ("sm_89", False), ("sm_80", False), ("", False), ("cpu", False)])
def test_supports_pdl_from_sm90(arch, ok):
    assert supports_pdl(arch) is ok


# ---- the parser on the forms kernels take ----------------------------------------------------

def test_launch_bounds_and_a_brace_on_the_next_line():
    src = ('extern "C" __global__ void __launch_bounds__(256, 2) k(const float* __restrict__ x, float* y)\n'
           '{\n  y[0] = x[0];\n}\n')
    assert instrument(src) == src.replace("\n{", "\n{" + ENTRY, 1)


def test_comments_and_strings_are_not_code():
    src = ('// extern "C" __global__ void fake() {\n'
           '/* __global__ void also_fake() { */\n'
           'extern "C" __global__ void k(int* p) /* { */ // {\n'
           '{ const char* s = "__global__ void f() {"; char c = \'{\'; asm volatile("{ .reg .u32 r; }"); }\n')
    out = check_instrumented(src)
    assert out.count(ENTRY) == 1 and out.index(ENTRY) == src.index("{ const char") + 1


def test_kernels_defined_in_macros_with_pasted_names():
    src = ('#define DEFINE(code, T)                                       \\\n'
           '  extern "C" __global__ void __launch_bounds__(T * T) mm_##code(  \\\n'
           '      const float* x, A8(shape)) {                             \\\n'
           '    x += 1;                                                    \\\n'
           '  }\n'
           'DEFINE(f32, 16)\nDEFINE(f16, 8)\n')
    out = check_instrumented(src)
    assert "A8(shape)) {" + ENTRY in out and out.count("\\\n") == src.count("\\\n")  # still one macro


def test_an_extern_c_block_and_several_kernels():
    src = 'extern "C" {\n__global__ void a(int* p) { p[0] = 1; }\n__global__ void b(int* p) { p[1] = 2; }\n}\n'
    assert check_instrumented(src).count(ENTRY) == 2


def test_two_headers_of_one_kernel_under_if_else():
    src = ('#if WIDE\nextern "C" __global__ void k(long n) {\n#else\nextern "C" __global__ void k(int n) {\n#endif\n'
           '  (void)n;\n}\n')
    assert check_instrumented(src).count(ENTRY) == 2


def test_digit_separators_raw_strings_and_crlf():
    src = ('const long big = 1\'000\'000;\r\nconst char* r = R"x( } __global__ void no() { )x";\r\n'
           'extern "C" __global__ void k(int* p)\r\n{\r\n  p[0] = big;\r\n}\r\n')
    assert check_instrumented(src).count(ENTRY) == 1


def test_an_apostrophe_in_a_directive_is_not_a_literal():
    src = '#error "don\'t"\n#pragma message("it\'s")\nextern "C" __global__ void k() { }\n'
    assert check_instrumented(src).count(ENTRY) == 1


def test_a_template_kernel_is_instrumented_too():
    # polykit launches extern "C" kernels only; a template's body gets the entry all the same
    src = "template <int N> __global__ void t(float* x) { x[N] = 0; }\n"
    assert check_instrumented(src).count(ENTRY) == 1


@pytest.mark.parametrize("src", [
    "__global__ void t(float* x) __attribute__((x)) = delete;\n",  # an operator after the parameters
    'extern "C" __global__ void declared(float* x);\n',  # a declaration without its body
    '#define KERNEL __global__\nextern "C" KERNEL void hidden(float* x) { }\n',  # __global__ behind a macro
    '#define HEAD(n) extern "C" __global__ void n(float* x)\nHEAD(k) { }\n',  # a body outside its #define
    'extern "C" __global__ void k(float* x)\n#if A\n{ }\n#else\n{ }\n#endif\n',  # a directive in the declarator
    '#if defined(__global__)\n#endif\n',  # __global__ inside another directive
    'extern "C" __global__ void k(float* x) BODY\n',  # the body comes from a macro
    'extern "C" __global__ void k(float* x) { /* unterminated\n',
    '// a comment continued \\\nextern "C" __global__ void k(float* x) { }\n',  # the kernel is in the comment
    "__device__ float f(float x) { return x; }\n",  # no kernel at all
])
def test_forms_the_parser_does_not_follow_leave_the_unit_plain(src):
    assert instrument(src) is None


def test_a_unit_the_parser_refuses_has_no_pdl_variant():
    source = KernelSource("t", code='extern "C" __global__ void t(float* x);\n')
    assert source.with_pdl() is None
    with pytest.raises(DeviceError, match="programmatic dependent launch"):
        KernelSource("t", code=source.code, pdl=True).render()


def test_a_kernel_that_defers_its_wait_gets_no_entry_and_the_others_do():
    text = ("extern \"C\" __global__ void early(const float* w, float* y) {\n  PK_PDL_DEFER();\n"
            "  float v = w[0];\n  PK_PDL_WAIT();\n  y[0] = v;\n}\n"
            "extern \"C\" __global__ void plain(float* y) { y[0] = 1.f; }\n")
    out = check_instrumented(text)
    assert out.count(ENTRY) == 1 and out.index(ENTRY) > out.index("plain")
    assert deferring(text) == 1


def test_the_weight_only_mma_kernels_defer_their_wait_and_their_reduce_does_not():
    for name in ("weight_only_mma_staged.cu", "weight_only_mma_rows.cu"):
        text = inline_includes((CUDA_DIR / name).read_text())
        out = check_instrumented(text)
        assert deferring(text) == 1 and "PK_PDL_WAIT();" in text
        assert out.count(ENTRY) == len(list(_GLOBAL.finditer(_mask(text)))) - 1  # every kernel but the deferring one
    staged = instrument(inline_includes((CUDA_DIR / "weight_only_mma_staged.cu").read_text()))
    reduce_at = staged.index("weight_only_mma_reduce(")
    assert staged.find(ENTRY, reduce_at) > reduce_at  # the reduce reads the workspace: it waits first
