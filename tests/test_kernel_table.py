"""dpscale.lab.kernel_table on names a profile of the tuned_fp16 step saw on the H200
(torch 2.11, cuDNN 9.19): every kind its table reports, and the wall it derives."""
from __future__ import annotations

import pytest

from dpscale.analysis import roofline
from dpscale.lab import kernel_table as kt

SEEN = {
    "void xmma__5x_cudnn::gemm::warp_specialized_kernel_gmma_utmaldg<xmma__5x_cudnn::implicit_gemm::fprop::Warp_spe": "conv_fprop",
    "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1_g1_execute_": "conv_fprop",
    "sm90_xmma_dgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x128x64_warpgroupsize2x1x1_g1_execute": "conv_dgrad",
    "sm90_xmma_wgrad_indexed_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_warpgroupsize1x1x1_g1_e": "conv_wgrad",
    # the runtime-fusion engine's dgrad + ReLU backward + sums (dpscale.lab.fused_dbn)
    "cudnn_generated_fort_native_sm90_convBwdData_pointwise_pointwise_pointwise_pointwise_reduction_reduction_knob_2_128x128x64_5_0": "conv_dgrad",
    "memcpy32_post": "copy_fill",
    "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::wgrad_": "conv_wgrad",
    # inductor's kernels name the aten ops they fuse; a convolution_backward in the name is not a conv
    "triton_poi_fused__to_copy_add_clamp_min_convolution_backward_div_mul_neg_rsqrt_threshold_backward_view_31": "triton_pointwise",
    "triton_red_fused__to_copy_mul_sum_threshold_backward_29": "triton_reduction",
    "triton_per_fused__native_batch_norm_legit_functional_0": "triton_reduction",
    "nvjet_sm90_hsh_64x384_64x3_1x2_h_bz_coopB_TNT": "gemm",
    "void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_f16_64x64_64x6_nt_align8>(cutlass_80_tensorop_s16816gemm_": "gemm",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorLis": "optimizer",
    "Memcpy DtoD (Device -> Device)": "copy_fill",
    "Memset (Unknown)": "copy_fill",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "nccl",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, at::native::b": "other",
}


@pytest.mark.parametrize("name", SEEN)
def test_each_kernel_seen_gets_its_kind(name):
    assert kt.kind(name) == SEEN[name]


def test_summary_is_per_step_and_the_idle_is_the_wall_the_kernels_leave():
    kernels = [("sm90_xmma_dgrad_a", 0.004, 20), ("triton_poi_fused_relu_1", 0.001, 10), ("Memset (Unknown)", 0.0005, 30)]
    s = kt.summarize(kernels, steps=10, wall_s_per_step=0.0006, top=2)
    assert s["kinds"]["conv_dgrad"] == {"ms": pytest.approx(0.4), "launches": 2.0}
    assert s["kernel_ms_per_step"] == pytest.approx(0.55)
    assert s["idle_ms"] == pytest.approx(0.05)
    assert [r["kind"] for r in s["top"]] == ["conv_dgrad", "triton_pointwise"]


def test_wall_adds_the_fusions_other_passes_at_copy_bandwidth_to_the_measured_convs():
    summary = {"kinds": {"conv_fprop": {"ms": 2.0}, "conv_dgrad": {"ms": 1.5}, "conv_wgrad": {"ms": 2.0},
                         "gemm": {"ms": 0.5}, "triton_pointwise": {"ms": 9.0}}}
    w = kt.wall(summary, 256, 64, 4.3e12, "stats_epilogue")
    rest = sum(p.bytes for p in roofline.step_passes(256, 64, "stats_epilogue")
               if p.op not in ("fprop", "dgrad", "wgrad") and p.host is None)
    assert w["conv_and_gemm_ms"] == 6.0 and w["other_passes_GB"] == pytest.approx(rest / 1e9)
    assert w["step_ms"] == pytest.approx(6.0 + 1e3 * rest / 4.3e12)
    assert w["samples_per_s"] == pytest.approx(256 / (w["step_ms"] / 1e3))
    # the measured elementwise kernels (9 ms) do not enter: the wall is what no better one can beat
    assert kt.wall(summary, 256, 64, 4.3e12, "ideal")["step_ms"] < w["step_ms"]
