"""ONNX's own node test cases for the nn op family (conv, gemm, pool, resize, spatial), run
through polykit: load_onnx (importers + shape rules), then the reference kernels node by node.

Outputs must match ONNX's expected values (dtype and shape exactly, values at ONNX's backend
tolerance rtol 1e-3, atol 1e-6) and the shape rules' static shapes must equal the real ones.
PASS_LIST names every case that must pass; a case of these ops missing from it (a new onnx
release, or an expanded case needing another family) is reported as a skip, not silently dropped.

Only these ops' onnx case modules are imported (the pool ones compute their expected values
with slow python loops: ~15 s of this module's time).
"""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from polykit.compiler.graph.evaluator import evaluate_graph
from polykit.compiler.graph.onnx_import import load_onnx
from polykit.compiler.ops.registry import is_supported
from tests.onnx_node_cases import node_cases

CASE_MODULES = (
    "averagepool causal_conv_with_state conv convinteger convtranspose depthtospace gemm globalaveragepool "
    "globalmaxpool lppool lrn matmul matmulinteger maxpool maxunpool resize spacetodepth upsample"
).split()

NN_OPS = {
    "Conv", "ConvTranspose", "ConvInteger", "MatMulInteger", "Gemm", "MatMul", "MaxPool", "AveragePool",
    "GlobalMaxPool", "GlobalAveragePool", "LpPool", "GlobalLpPool", "LRN", "MaxUnpool", "Resize", "Upsample",
    "DepthToSpace", "SpaceToDepth",
}


CASES = {name: c for name, c in node_cases(CASE_MODULES).items()
         if any(n.op_type in NN_OPS for n in c.model.graph.node)}

#: Every case known to pass (all single-node cases of the family and the expanded cases whose
#: other ops exist); written out so a regression or a vanished case is visible in review.
PASS_LIST = frozenset("""
test_averagepool_1d_default test_averagepool_2d_ceil test_averagepool_2d_ceil_last_window_starts_on_pad
test_averagepool_2d_default test_averagepool_2d_dilations test_averagepool_2d_pads
test_averagepool_2d_pads_count_include_pad test_averagepool_2d_precomputed_pads
test_averagepool_2d_precomputed_pads_count_include_pad test_averagepool_2d_precomputed_same_upper
test_averagepool_2d_precomputed_strides test_averagepool_2d_same_lower test_averagepool_2d_same_upper
test_averagepool_2d_strides test_averagepool_3d_default test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False
test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True
test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False
test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True
test_averagepool_3d_dilations_small
test_causal_conv_with_state_b1_c1_degenerate_expanded test_causal_conv_with_state_basic_expanded
test_causal_conv_with_state_decode_step_expanded test_causal_conv_with_state_fp16_expanded
test_causal_conv_with_state_kernel_size_one_expanded test_causal_conv_with_state_short_input_no_past_state_expanded
test_causal_conv_with_state_silu_expanded test_causal_conv_with_state_silu_fp16_expanded
test_causal_conv_with_state_silu_with_past_state_expanded test_causal_conv_with_state_swish_alias_expanded
test_causal_conv_with_state_with_bias_and_past_state_expanded test_causal_conv_with_state_with_bias_expanded
test_causal_conv_with_state_with_past_state_expanded
test_basic_conv_with_padding test_basic_conv_without_padding test_conv_with_autopad_same
test_conv_with_strides_and_asymmetric_padding test_conv_with_strides_no_padding test_conv_with_strides_padding
test_convinteger_with_padding test_convinteger_without_padding
test_convtranspose test_convtranspose_1d test_convtranspose_3d test_convtranspose_autopad_same
test_convtranspose_dilations test_convtranspose_group_2 test_convtranspose_group_2_image_3
test_convtranspose_kernel_shape test_convtranspose_output_shape test_convtranspose_pad test_convtranspose_pads
test_depthtospace_crd_mode_example test_depthtospace_example
test_gemm_all_attributes test_gemm_alpha test_gemm_beta test_gemm_default_matrix_bias test_gemm_default_no_bias
test_gemm_default_scalar_bias test_gemm_default_single_elem_vector_bias test_gemm_default_vector_bias
test_gemm_default_zero_bias test_gemm_transposeA test_gemm_transposeB
test_globalaveragepool test_globalaveragepool_precomputed test_globalmaxpool test_globalmaxpool_precomputed
test_lppool_1d_default test_lppool_2d_default test_lppool_2d_dilations test_lppool_2d_pads
test_lppool_2d_same_lower test_lppool_2d_same_upper test_lppool_2d_strides test_lppool_3d_default
test_lrn test_lrn_default
test_matmul_1d_1d test_matmul_1d_3d test_matmul_2d test_matmul_3d test_matmul_4d test_matmul_4d_1d test_matmul_bcast
test_matmulinteger
test_maxpool_1d_default test_maxpool_2d_ceil test_maxpool_2d_ceil_output_size_reduce_by_one test_maxpool_2d_default
test_maxpool_2d_dilations test_maxpool_2d_pads test_maxpool_2d_precomputed_pads test_maxpool_2d_precomputed_same_upper
test_maxpool_2d_precomputed_strides test_maxpool_2d_same_lower test_maxpool_2d_same_upper test_maxpool_2d_strides
test_maxpool_2d_uint8 test_maxpool_3d_default test_maxpool_3d_dilations test_maxpool_3d_dilations_use_ref_impl
test_maxpool_3d_dilations_use_ref_impl_large test_maxpool_with_argmax_2d_precomputed_pads
test_maxpool_with_argmax_2d_precomputed_strides
test_maxunpool_export_with_output_shape test_maxunpool_export_without_output_shape
test_resize_downsample_scales_cubic test_resize_downsample_scales_cubic_A_n0p5_exclude_outside
test_resize_downsample_scales_cubic_antialias
test_resize_downsample_scales_linear
test_resize_downsample_scales_linear_antialias test_resize_downsample_scales_linear_half_pixel_symmetric
test_resize_downsample_scales_nearest test_resize_downsample_sizes_cubic test_resize_downsample_sizes_cubic_antialias
test_resize_downsample_sizes_linear_antialias test_resize_downsample_sizes_linear_pytorch_half_pixel
test_resize_downsample_sizes_nearest test_resize_downsample_sizes_nearest_not_larger
test_resize_downsample_sizes_nearest_not_smaller test_resize_tf_crop_and_resize test_resize_tf_crop_and_resize_axes_2_3
test_resize_tf_crop_and_resize_axes_3_2 test_resize_tf_crop_and_resize_extrapolation_value
test_resize_upsample_scales_cubic test_resize_upsample_scales_cubic_A_n0p5_exclude_outside
test_resize_upsample_scales_cubic_align_corners test_resize_upsample_scales_cubic_asymmetric
test_resize_upsample_scales_linear test_resize_upsample_scales_linear_align_corners
test_resize_upsample_scales_linear_half_pixel_symmetric test_resize_upsample_scales_nearest
test_resize_upsample_scales_nearest_axes_2_3 test_resize_upsample_scales_nearest_axes_3_2
test_resize_upsample_sizes_cubic test_resize_upsample_sizes_nearest test_resize_upsample_sizes_nearest_axes_2_3
test_resize_upsample_sizes_nearest_axes_3_2 test_resize_upsample_sizes_nearest_ceil_half_pixel
test_resize_upsample_sizes_nearest_floor_align_corners test_resize_upsample_sizes_nearest_not_larger
test_resize_upsample_sizes_nearest_not_smaller test_resize_upsample_sizes_nearest_round_prefer_ceil_asymmetric
test_spacetodepth test_spacetodepth_crd_mode_example test_spacetodepth_dcr_mode_example test_spacetodepth_example
test_upsample_nearest
""".split())


#: Cases where polykit follows the ONNX spec and onnxruntime rather than ONNX's python reference
#: (which divides by the fractional output width 2.4 where the spec says length_resized = 2).
#: Their outputs are checked against onnxruntime instead.
FOLLOWS_ONNXRUNTIME = {
    "test_resize_downsample_scales_linear_align_corners": "align_corners uses the integer output length",
    "test_resize_downsample_scales_cubic_align_corners": "align_corners uses the integer output length",
}


def _as_array(value):
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def _evaluate(graph, feeds):
    """The graph's outputs, every tensor checked against what its shape rule inferred."""

    def check_rule(name, arr, node):
        inferred = graph.value(name)
        if inferred.shape is not None:
            assert len(inferred.shape) == arr.ndim, f"{name}: rule rank {inferred.shape} vs {arr.shape}"
            for rule_dim, real in zip(inferred.shape, arr.shape):
                assert not isinstance(rule_dim, int) or rule_dim == real, f"{name}: {inferred.shape} vs {arr.shape}"
        assert inferred.dtype is None or inferred.dtype == arr.dtype, f"{name}: dtype {inferred.dtype} vs {arr.dtype}"

    return evaluate_graph(graph, feeds, on_tensor=check_rule)


def _check_case(case) -> None:
    graph = load_onnx(case.model)
    real_inputs = [vi.name for vi in case.model.graph.input if vi.name not in graph.initializers]
    for inputs, expected in case.data_sets:
        env = _evaluate(graph, {n: _as_array(v) for n, v in zip(real_inputs, inputs)})
        for out_name, want in zip(graph.outputs, expected):
            want, got = _as_array(want), env[out_name]
            assert got.dtype == want.dtype, f"{out_name}: dtype {got.dtype} != {want.dtype}"
            assert got.shape == want.shape, f"{out_name}: shape {got.shape} != {want.shape}"
            if want.dtype.kind in "fc":
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6, err_msg=out_name)
            else:
                np.testing.assert_array_equal(got, want, err_msg=out_name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case_matches_onnx_expected_outputs(name):
    case = CASES[name]
    if name in FOLLOWS_ONNXRUNTIME:
        pytest.skip(f"polykit follows the spec and onnxruntime here: {FOLLOWS_ONNXRUNTIME[name]}")
    if name not in PASS_LIST:
        missing = sorted({n.op_type for n in case.model.graph.node if not is_supported(n.domain, n.op_type)})
        pytest.skip(f"not in the pass list (unsupported ops: {missing or 'none'}); add it once it passes")
    _check_case(case)


@pytest.mark.parametrize("name", sorted(FOLLOWS_ONNXRUNTIME))
def test_case_where_polykit_follows_the_spec_matches_onnxruntime(name):
    import onnxruntime

    case = CASES[name]
    inputs, _ = case.data_sets[0]
    feeds = {vi.name: _as_array(v) for vi, v in zip(case.model.graph.input, inputs)}
    want = onnxruntime.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    graph = load_onnx(case.model)
    env = _evaluate(graph, feeds)
    for out_name, expected in zip(graph.outputs, want):
        np.testing.assert_allclose(env[out_name], expected, rtol=1e-5, atol=1e-6)


def test_pass_list_names_only_real_cases():
    assert PASS_LIST <= set(CASES)
    assert not PASS_LIST & set(FOLLOWS_ONNXRUNTIME)


def test_pass_list_covers_every_single_node_case_of_the_family():
    single = {name for name, c in CASES.items() if len(c.model.graph.node) == 1}
    assert len(single) >= 139
    assert single - PASS_LIST == set(FOLLOWS_ONNXRUNTIME)
