"""`flash_ran`'s verdict (codegen.gpu.validate.app) on CPU: the rules over kernel and op names as
the profiler reports them on ROCm and on CUDA, the op table against the torch installed here, and
the clean refusal without a GPU. The real runs: tests/test_apps_gpu.py (`gpu`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # codegen.gpu.validate.gpu imports it

from codegen.core.errors import EnvironmentMissing
from codegen.gpu.validate import app
from codegen.gpu.validate.gpu import profile_run

FLASH = "aten::_scaled_dot_product_flash_attention"
# kernel names as the profiler reports them (templates shortened)
CUDA_FWD = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false>, false>(Flash_fwd_params)"
CUDA_BWD = ("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64>>(Flash_bwd_params)",
            "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>(Flash_bwd_params)")
ROCM = ("attn_fwd", "bwd_preprocess", "bwd_kernel_dk_dv", "bwd_kernel_dq")
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def test_flash_forward_and_backward_on_cuda():
    run = app.read_run("cuda", [CUDA_FWD, *CUDA_BWD, GEMM], ["aten::mm", FLASH, FLASH + "_backward"])
    assert run.flash and not run.math and run.backends == ("flash",)
    assert run.kernels == ("flash_bwd_dot_do_o_kernel", "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
                           "flash_fwd_kernel")
    assert "flash: yes" in str(run) and "not AOTriton" in str(run)


def test_flash_on_rocm_is_aotritons_kernels():
    run = app.read_run("rocm", list(ROCM), [FLASH, FLASH + "_backward"])
    assert run.flash and run.kernels == ("attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_preprocess")
    assert "(AOTriton)" in str(run)
    # the ROCm patterns do not take CUDA's names, nor the other way round
    assert not app.read_run("rocm", [CUDA_FWD], [FLASH]).flash
    assert not app.read_run("cuda", ["attn_fwd"], [FLASH]).flash


def test_flash_needs_its_kernels_not_only_the_op():
    # dispatched to flash, but no flash kernel in the trace: not proven
    assert not app.read_run("cuda", [GEMM], [FLASH]).flash
    # a backward ran but no backward kernel did
    run = app.read_run("rocm", ["attn_fwd"], [FLASH, FLASH + "_backward"])
    assert not run.flash and run.kernels == ("attn_fwd",)
    # forward only (inference): the forward kernel is enough
    assert app.read_run("rocm", ["attn_fwd"], [FLASH]).flash


def test_math_fallback_and_mixed_calls():
    run = app.read_run("rocm", [GEMM], ["aten::_scaled_dot_product_attention_math", "aten::bmm"])
    assert run.math and not run.flash and run.backends == ("math",)
    assert "math fallback: YES" in str(run) and "kernels (AOTriton): none in the trace" in str(run)
    mixed = app.read_run("cuda", [CUDA_FWD], [FLASH, "aten::_scaled_dot_product_attention_math"])
    assert mixed.math and mixed.backends == ("flash", "math")


def test_other_backends_and_no_sdpa_at_all():
    eff = app.read_run("cuda", ["fmha_cutlassF_f16_aligned_64x64_rf_sm80"], ["aten::_scaled_dot_product_efficient_attention"])
    assert not eff.flash and not eff.math and eff.backends == ("efficient",)
    assert eff.kernels == ("fmha_cutlassF_f16_aligned_64x64_rf_sm80",)
    cudnn = app.read_run("cuda", [], ["aten::_scaled_dot_product_cudnn_attention"])
    assert cudnn.backends == ("cudnn",) and not cudnn.flash
    none = app.read_run("cuda", [GEMM], ["aten::bmm", "aten::_softmax"])
    assert none.backends == () and not none.flash and not none.math
    assert "No scaled_dot_product_attention call" in str(none)


def test_the_op_table_names_what_this_torch_records():
    """The math op name is read from a real profile here (CPU torch), not assumed."""
    x = torch.randn(1, 2, 16, 32)

    def math_call():
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
            torch.nn.functional.scaled_dot_product_attention(x, x, x)

    kernels, ops = profile_run(math_call)
    run = app.read_run("cuda", kernels, ops)
    assert run.math and run.backends == ("math",), ops
    eager_kernels, eager_ops = profile_run(lambda: torch.softmax(x @ x.transpose(-2, -1), -1) @ x)
    assert app.read_run("cuda", eager_kernels, eager_ops).backends == ()


def test_flash_ran_without_a_gpu_is_a_clean_refusal(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    called = []
    with pytest.raises(EnvironmentMissing, match="no GPU"):
        app.flash_ran(lambda: called.append(1))
    assert not called
