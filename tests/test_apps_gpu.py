"""The app notes (docs/howto/apps.md) run for real: a tiny transformers model with
attn_implementation="sdpa", a small diffusers UNet, and the one SDPA call ComfyUI makes with
--use-pytorch-cross-attention, each checked with `flash_ran`, each beside a negative control that
must not pass. Models are built from configs (no downloads). Skipped without a GPU, and without
transformers or diffusers for their tests."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from codegen.gpu.validate.app import flash_ran  # imports torch: after the skip above

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu")]

DEV = "cuda"  # ROCm's torch names its GPU "cuda" too


@pytest.fixture(autouse=True)
def _no_cudnn_attention_on_the_proxy():
    """On the NVIDIA proxy (torch 2.11, H200) SDPA's default order takes cuDNN attention for every
    call here; ROCm has AOTriton's flash and efficient backends. cuDNN's is switched off on CUDA so
    the proxy takes the flash path an owner's ROCm torch takes; on ROCm nothing is changed."""
    if torch.version.hip:
        yield
        return
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    yield
    torch.backends.cuda.enable_cudnn_sdp(was)


# --- transformers ----------------------------------------------------------------------------------
def _llama(head_dim: int, heads: int, kv_heads: int, attn: str):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.bfloat16)
    return model.to(DEV)


def _train_step(model, ids) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss.detach())


@pytest.mark.parametrize("head_dim,heads,kv_heads", [(32, 4, 2), (64, 2, 2)], ids=["d32-gqa", "d64"])
def test_transformers_sdpa_runs_flash_and_eager_does_not(head_dim, heads, kv_heads):
    ids = torch.randint(0, 512, (2, 256), generator=torch.Generator().manual_seed(1)).to(DEV)
    losses: dict[str, float] = {}
    runs = {}
    for attn in ("sdpa", "eager"):
        model = _llama(head_dim, heads, kv_heads, attn)
        runs[attn] = flash_ran(lambda: losses.update({attn: _train_step(model, ids)}))
    print(f"sdpa: {runs['sdpa']}\neager: {runs['eager']}\nlosses: {losses}")
    assert runs["sdpa"].flash and not runs["sdpa"].math, runs["sdpa"]
    assert runs["sdpa"].backends == ("flash",), runs["sdpa"]
    # negative control: the same weights with transformers' own attention (matmul + softmax)
    assert not runs["eager"].flash and runs["eager"].backends == (), runs["eager"]
    assert abs(losses["sdpa"] - losses["eager"]) < 0.02 * abs(losses["eager"]), losses


# --- diffusers -------------------------------------------------------------------------------------
def _unet():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    # 2 heads per attention (`attention_head_dim` is a head count here): head dim 32 in the 64-channel
    # blocks, 64 in the 128-channel middle block; self- and cross-attention, no masks
    unet = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(64, 128),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=64, attention_head_dim=2, norm_num_groups=32)
    return unet.to(DEV, torch.bfloat16)


def _unet_step(unet) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 16, 16, generator=g).to(DEV, torch.bfloat16)
    ctx = torch.randn(2, 8, 64, generator=g).to(DEV, torch.bfloat16)
    t = torch.tensor([10, 500], device=DEV)
    unet(x, t, encoder_hidden_states=ctx).sample.float().pow(2).mean().backward()


def test_diffusers_unet_runs_flash_and_the_classic_processor_does_not():
    processors = pytest.importorskip("diffusers.models.attention_processor")
    unet = _unet()
    assert {type(p).__name__ for p in unet.attn_processors.values()} == {"AttnProcessor2_0"}
    run = flash_ran(lambda: _unet_step(unet))
    # negative control: diffusers' classic processor computes attention with baddbmm + softmax
    unet.set_attn_processor(processors.AttnProcessor())
    control = flash_ran(lambda: _unet_step(unet))
    print(f"AttnProcessor2_0: {run}\nAttnProcessor: {control}")
    assert run.flash and not run.math, run
    assert run.backends == ("flash",), run
    assert not control.flash and control.backends == (), control


# --- ComfyUI ---------------------------------------------------------------------------------------
def comfy_attention(q, k, v, heads: int, mask=None):
    """The attention ComfyUI runs with --use-pytorch-cross-attention, reproduced (ComfyUI is not on
    PyPI): tokens x (heads * head_dim) split into heads, one SDPA call with no dropout and no
    causal mask, heads merged back."""
    b, _, inner = q.shape
    q, k, v = (t.view(b, -1, heads, inner // heads).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
    return out.transpose(1, 2).reshape(b, -1, inner)


def _qkv(tokens: int, ctx_tokens: int, heads: int, head_dim: int, dtype):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, tokens, heads * head_dim, generator=g)
    k, v = (torch.randn(2, ctx_tokens, heads * head_dim, generator=g) for _ in range(2))
    return tuple(t.to(DEV, dtype) for t in (q, k, v))


# SD 1.5-like self-attention (8 heads of 40; AOTriton pads 40 up to its 64 kernel) and SDXL-like
# cross-attention (10 heads of 64, 77 text tokens)
@pytest.mark.parametrize("tokens,ctx_tokens,heads,head_dim", [(1024, 1024, 8, 40), (1024, 77, 10, 64)],
                         ids=["self-d40", "cross-d64"])
def test_comfyui_pytorch_attention_runs_flash(tokens, ctx_tokens, heads, head_dim):
    q, k, v = _qkv(tokens, ctx_tokens, heads, head_dim, torch.float16)
    with torch.inference_mode():
        run = flash_ran(lambda: comfy_attention(q, k, v, heads))
    print(run)
    assert run.flash and not run.math, run
    assert run.backends == ("flash",), run


def test_comfyui_negative_controls_fall_back():
    # float64: no fused backend takes it, so SDPA falls back to math
    q, k, v = _qkv(256, 256, 4, 64, torch.float64)
    math = flash_ran(lambda: comfy_attention(q, k, v, 4))
    assert math.math and not math.flash and math.backends == ("math",), math

    # a mask (masked workflows): flash takes none, the memory-efficient backend serves the call
    q, k, v = _qkv(256, 256, 4, 64, torch.float16)
    mask = torch.zeros(1, 1, 256, 256, device=DEV, dtype=torch.float16)
    masked = flash_ran(lambda: comfy_attention(q, k, v, 4, mask))
    print(f"float64: {math}\nmasked: {masked}")
    assert not masked.flash and not masked.math and masked.backends == ("efficient",), masked
    assert masked.kernels, masked
