"""The tactic table: keyed by (target, domain, kind), duplicates refused, GPU-arch filter,
workspace declared per layer, parameters that are values the code reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polykit.compiler.plan.records import LayerDesc, TensorDesc
from polykit.kernels.cpu.base import CpuTactic
from polykit.kernels.tactics import Tactic, TacticTable, all_tactics, candidates, conservative_tactic, find_tactic
from polykit.plugins import PluginError


def _matmul(**kw):
    return LayerDesc("mm", "MatMul", ("a", "b"), ("y",), **kw)


def test_registering_a_second_tactic_under_a_taken_name_is_a_plugin_error():
    table = TacticTable()
    table.register(Tactic("cpu", "MatMul", "cpu.mine"))
    with pytest.raises(PluginError, match="two tactics named 'cpu.mine'"):
        table.register(Tactic("cpu", "MatMul", "cpu.mine", priority=3))


def test_the_same_tactic_registered_again_is_kept_once():
    table, tactic = TacticTable(), Tactic("cpu", "MatMul", "cpu.mine")
    table.register(tactic)
    table.register(tactic)
    assert table.of_kind("cpu", "", "MatMul") == [tactic]


def test_one_name_may_serve_several_kinds_and_domains():
    table = TacticTable()
    table.register(Tactic("cpu", "MatMul", "cpu.mine"))
    table.register(Tactic("cpu", "Gemm", "cpu.mine"))
    table.register(Tactic("cpu", "MatMul", "cpu.mine", domain="ai.polykit"))
    assert [t.kind for t in table.of_target("cpu")] == ["Gemm", "MatMul", "MatMul"]


def test_domain_specific_tactics_serve_only_their_domain():
    table = TacticTable()
    anywhere, fused = Tactic("cpu", "Conv", "cpu.any", priority=1), Tactic("cpu", "Conv", "cpu.fused", domain="ai.polykit")
    table.register(anywhere)
    table.register(fused)
    assert table.of_kind("cpu", "", "Conv") == [anywhere]
    assert table.of_kind("cpu", "ai.polykit", "Conv") == [anywhere, fused]


def test_arch_restricted_tactics_are_candidates_only_on_their_arch():
    wgmma = Tactic("cuda", "MatMul", "cuda.test.wgmma", archs=("sm_90",))
    assert wgmma.runs_on("sm_90") and not wgmma.runs_on("sm_80") and not wgmma.runs_on("")
    assert Tactic("cuda", "MatMul", "cuda.test.any").runs_on("")


def test_candidates_filter_cuda_tactics_by_the_build_arch():
    from polykit.kernels import tactics
    from polykit.plugins import reset_plugin_manager

    table = tactics.tactic_table("cuda")
    wgmma = Tactic("cuda", "MatMul", "cuda.test.wgmma", priority=99, archs=("sm_90",))
    table.register(wgmma)
    try:
        layer = _matmul(precision="fp16")
        assert candidates("cuda", "MatMul", layer, arch="sm_90")[0] is wgmma
        assert wgmma not in candidates("cuda", "MatMul", layer, arch="sm_80")
        assert wgmma not in candidates("cuda", "MatMul", layer, arch="")
    finally:
        reset_plugin_manager()  # the next lookup loads a fresh table through the hooks


def test_every_cuda_tactic_has_json_value_params_and_gemm_conv_tiles():
    for t in all_tactics("cuda"):
        json.dumps(dict(t.params))
        assert all(isinstance(v, (int, float)) for v in t.params.values()), (t.name, t.params)
    assert dict(find_tactic("cuda", "MatMul", "cuda.gemm.simt").params) == {"tile_m": 64, "tile_n": 64, "tile_k": 16}
    assert dict(find_tactic("cuda", "Conv", "cuda.conv.igemm_mma").params) == {"tile_m": 128, "tile_n": 128,
                                                                               "tile_k": 32}


def _tensors(**shapes):
    return {n: TensorDesc(n, "float32", s, "activation", -1, 4 * int(np.prod(s))) for n, s in shapes.items()}


def test_split_k_gemm_declares_the_partials_it_asks_for():
    from polykit.kernels.cuda.gemm.gemm import split_k

    simt = find_tactic("cuda", "MatMul", "cuda.gemm.simt")
    tensors = _tensors(a=(32, 4096), b=(4096, 64), y=(32, 64))
    splits = split_k(1, 4096, 16, 132, 1)
    assert splits > 1
    assert simt.workspace(_matmul(), tensors, 132) == 4 * splits * 32 * 64
    assert simt.workspace(_matmul(), tensors, 0) == 0  # unknown device: no split, no workspace
    big = _tensors(a=(4096, 256), b=(256, 4096), y=(4096, 4096))
    assert simt.workspace(_matmul(), big, 132) == 0  # enough tiles: one K slice


def test_implicit_gemm_conv_declares_its_split_k_workspace():
    conv = find_tactic("cuda", "Conv", "cuda.conv.igemm_simt")
    layer = LayerDesc("c", "Conv", ("x", "w"), ("y",), {"kernel_shape": [3, 3]})
    tensors = _tensors(x=(1, 512, 7, 7), w=(64, 512, 3, 3), y=(1, 64, 5, 5))
    need = conv.workspace(layer, tensors, 132)
    assert need > 0 and need % (4 * 64 * 25) == 0


def test_cpu_reference_serves_every_kind_with_a_reference_kernel():
    ref = find_tactic("cpu", "Softmax", "cpu.reference")
    assert isinstance(ref, CpuTactic)
    assert candidates("cpu", "Softmax", LayerDesc("s", "Softmax", ("x",), ("y",)))[0] is ref
    assert not candidates("cpu", "NoSuchOp", LayerDesc("n", "NoSuchOp", ("x",), ("y",)))


def _conv(group=1, precision="fp32", dtype="float32"):
    return LayerDesc("c", "Conv", ("x", "w"), ("y",), {"kernel_shape": [3, 3], "group": group}, precision=precision,
                     in_dtypes=(dtype, dtype), out_dtypes=(dtype,), in_shapes=((1, 8, 9, 9), (8, 8 // group, 3, 3)),
                     out_shapes=((1, 8, 7, 7),))


def test_the_conservative_cpu_tactic_is_the_reference_kernel_not_the_lowest_priority_one():
    layer = _conv()
    assert candidates("cpu", "Conv", layer)[-1].name.startswith("cpu.conv.")
    assert conservative_tactic("cpu", "Conv", layer).name == "cpu.reference"
    assert conservative_tactic("cpu", "Softmax", LayerDesc("s", "Softmax", ("x",), ("y",))).name == "cpu.reference"


@pytest.mark.parametrize("layer, kind, expected", [
    (_conv(), "Conv", "cuda.conv.igemm_simt"),
    (_conv(group=2), "Conv", "cuda.conv.igemm_simt"),  # not cuda.conv.direct, which the heuristic prefers
    (_conv(precision="fp16", dtype="float16"), "Conv", "cuda.conv.igemm_simt"),  # not igemm_mma
    (_matmul(precision="fp16", in_dtypes=("float16", "float16"), out_dtypes=("float16",)), "MatMul", "cuda.gemm.simt"),  # not sm90 or mma
    (_matmul(), "MatMul", "cuda.gemm.simt"),  # not simt_wide, which sits below it in priority
    (LayerDesc("c", "ConvNHWC", ("x", "w"), ("y",), {"kernel_shape": [3, 3]}, domain="ai.polykit", precision="fp32",
               in_dtypes=("float32", "float32"), out_dtypes=("float32",), in_shapes=((1, 9, 9, 8), (8, 3, 3, 8)),
               out_shapes=((1, 7, 7, 8),)), "ConvNHWC", "cuda.conv_nhwc.igemm_simt"),  # not the wide tile
])
def test_the_conservative_cuda_tactic_is_the_plainest_kernel_that_runs_the_layer(layer, kind, expected):
    assert conservative_tactic("cuda", kind, layer, arch="sm_90").name == expected


def test_a_layer_no_tactic_runs_has_no_conservative_tactic():
    assert conservative_tactic("cpu", "NoSuchOp", LayerDesc("n", "NoSuchOp", ("x",), ("y",))) is None
