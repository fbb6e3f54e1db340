"""The zoo's models: which architectures `benchmarks/zoo.py` times, their inputs and batches.

Every entry is random-weight and offline (torchvision `weights=None`, timm `pretrained=False`,
transformers built from a config). `ZooModel` is plain data, importable without torch; `make`
imports its library only when called. `prepare` turns a fresh model into one whose fp32
outputs mean something: weights that the library initializes to zero (torchvision ViT's
head) get a small normal init, and BatchNorm running statistics are re-estimated on random
inputs, so every normalized layer sees unit-variance activations as in a trained network
(with the default mean 0 / variance 1, residual sums grow block after block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

CONV, TRANSFORMER, VIDEO = "conv", "transformer", "video"
FAMILIES = (CONV, TRANSFORMER, VIDEO)

#: the architecture traits issues #29 and #30 ask the zoo to cover, by family
REQUIRED = {
    CONV: ("resnet50-baseline", "depthwise-separable", "squeeze-excitation", "grouped-conv", "channel-shuffle",
           "dense-concat", "layernorm-large-depthwise", "upsampling"),
    TRANSFORMER: ("bert-encoder", "causal-decoder", "vision-transformer", "windowed-attention", "speech-encoder",
                  "t5-encoder", "rmsnorm-rotary-swiglu-gqa", "conv-frontend", "timm-vit"),
    # issue #29 item 2's 3-D convolutions (to_channels_last's conv3d): a full 3x3x3 net and a (2+1)-D one
    VIDEO: ("3d-conv", "2plus1d-conv"),
}


@dataclass(frozen=True)
class InputSpec:
    """One model input: `shape` without the batch dimension; `kind` "normal" (float32 N(0, 1)),
    "ids" (int64 in [0, high)) or "ones" (an int64 attention mask of ones)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "normal"
    high: int = 0


@dataclass(frozen=True)
class ZooModel:
    name: str
    family: str
    covers: tuple[str, ...]  # architecture traits (REQUIRED's words, and others)
    inputs: tuple[InputSpec, ...]
    batches: tuple[int, ...]  # 1 and a throughput batch
    make: Callable[[], Any]  # a fresh torch.nn.Module in eval mode (torch seeded by the caller)


def image(size: int = 224) -> tuple[InputSpec, ...]:
    return (InputSpec("x", (3, size, size)),)


def tokens(vocab: int, seq: int = 128) -> tuple[InputSpec, ...]:
    """Token ids and an all-ones attention mask. Causal decoders get the mask too: without one,
    transformers 5 looks for packed sequences in the position ids with torch.diff, which the
    TorchScript exporter cannot export (GPT-2 and LLaMA failed so)."""
    return InputSpec("input_ids", (seq,), "ids", vocab), InputSpec("attention_mask", (seq,), "ones")


def torchvision_model(name: str, **kwargs: Any) -> Callable[[], Any]:
    def make():
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kwargs)
    return make


def video_model(name: str) -> Callable[[], Any]:
    def make():
        from torchvision.models import video

        return getattr(video, name)(weights=None)
    return make


def clip(frames: int = 16, size: int = 112) -> tuple[InputSpec, ...]:
    """A video clip [3, frames, size, size] (the batch dimension added by make_inputs)."""
    return (InputSpec("x", (3, frames, size, size)),)


def segmentation_model(name: str) -> Callable[[], Any]:
    def make():
        from torchvision.models import segmentation

        return getattr(segmentation, name)(weights=None, weights_backbone=None, aux_loss=False)
    return make


def timm_model(name: str, **kwargs: Any) -> Callable[[], Any]:
    def make():
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)
    return make


def transformers_model(model: str, config: str, **settings: Any) -> Callable[[], Any]:
    """transformers' `model` class (a dotted path below transformers.models where the top level
    lacks it) built from `config`(**settings)."""
    def make():
        import importlib

        import transformers

        module, _, cls = model.rpartition(".")
        owner = importlib.import_module(f"transformers.models.{module}") if module else transformers
        return getattr(owner, cls)(getattr(transformers, config)(**settings))
    return make


def unet(base: int = 32, depth: int = 4, classes: int = 2) -> Callable[[], Any]:
    """A classic UNet: double 3x3 conv + BN + ReLU per level, max-pool down, transposed-conv up,
    skip concatenation, 1x1 classifier."""
    def make():
        import torch
        from torch import nn

        def double(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True),
                                 nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True))

        class UNet(nn.Module):
            def __init__(self):
                super().__init__()
                widths = [base << i for i in range(depth + 1)]
                self.down = nn.ModuleList([double(3, widths[0])] + [double(a, b) for a, b in zip(widths, widths[1:])])
                self.up = nn.ModuleList([nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in zip(widths, widths[1:])])
                self.merge = nn.ModuleList([double(2 * a, a) for a in widths[:-1]])
                self.head = nn.Conv2d(widths[0], classes, 1)

            def forward(self, x):
                skips = []
                for i, block in enumerate(self.down):
                    x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
                    skips.append(x)
                for up, merge, skip in reversed(list(zip(self.up, self.merge, skips[:-1]))):
                    x = merge(torch.cat([skip, up(x)], dim=1))
                return self.head(x)

        return UNet()
    return make


def _conv(name, covers, make, size=224, batches=(1, 32)) -> ZooModel:
    return ZooModel(name, CONV, covers, image(size), batches, make)


def _transformer(name, covers, inputs, make, batches=(1, 8)) -> ZooModel:
    return ZooModel(name, TRANSFORMER, covers, inputs, batches, make)


def _video(name, covers, make, batches=(1, 8)) -> ZooModel:
    return ZooModel(name, VIDEO, covers, clip(), batches, make)


_LLAMA = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=512, use_cache=False)
_WHISPER = dict(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80,
                max_source_positions=1500)
_T5 = dict(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128, use_cache=False)
_SEG = (1, 8)

MODELS: tuple[ZooModel, ...] = (
    _conv("resnet18", ("residual",), torchvision_model("resnet18")),
    _conv("resnet50", ("resnet50-baseline", "residual", "bottleneck"), torchvision_model("resnet50")),
    _conv("resnext50_32x4d", ("grouped-conv", "residual"), torchvision_model("resnext50_32x4d")),
    _conv("mobilenet_v2", ("depthwise-separable", "inverted-residual"), torchvision_model("mobilenet_v2")),
    _conv("mobilenet_v3_large", ("depthwise-separable", "squeeze-excitation", "hardswish"),
          torchvision_model("mobilenet_v3_large")),
    _conv("efficientnet_b0", ("depthwise-separable", "squeeze-excitation", "silu"), torchvision_model("efficientnet_b0")),
    _conv("efficientnet_v2_s", ("fused-mbconv", "squeeze-excitation", "silu"), torchvision_model("efficientnet_v2_s"),
          size=384),
    _conv("regnet_y_800mf", ("squeeze-excitation", "grouped-conv"), torchvision_model("regnet_y_800mf")),
    _conv("regnet_x_1_6gf", ("grouped-conv",), torchvision_model("regnet_x_1_6gf")),
    _conv("shufflenet_v2_x1_0", ("channel-shuffle", "depthwise-separable"), torchvision_model("shufflenet_v2_x1_0")),
    _conv("densenet121", ("dense-concat",), torchvision_model("densenet121")),
    _conv("convnext_tiny", ("layernorm-large-depthwise", "gelu"), torchvision_model("convnext_tiny")),
    _conv("mnasnet1_0", ("depthwise-separable",), torchvision_model("mnasnet1_0")),
    _conv("squeezenet1_1", ("fire-concat", "no-batchnorm"), torchvision_model("squeezenet1_1")),
    _conv("googlenet", ("inception-concat",), torchvision_model("googlenet", aux_logits=False, init_weights=True)),
    _conv("inception_v3", ("inception-concat", "asymmetric-kernels"),
          torchvision_model("inception_v3", aux_logits=False, init_weights=True), size=299),
    _conv("vgg11_bn", ("plain-deep", "large-fc"), torchvision_model("vgg11_bn")),
    _conv("fcn_resnet50", ("upsampling", "dilated-conv", "segmentation"), segmentation_model("fcn_resnet50"),
          size=512, batches=_SEG),
    _conv("deeplabv3_mobilenet_v3_large", ("upsampling", "aspp", "segmentation", "depthwise-separable"),
          segmentation_model("deeplabv3_mobilenet_v3_large"), size=512, batches=_SEG),
    _conv("unet", ("upsampling", "transposed-conv", "skip-concat", "segmentation"), unet(), size=512, batches=_SEG),
    _transformer("bert_base", ("bert-encoder",), tokens(30522), transformers_model("BertModel", "BertConfig")),
    _transformer("distilbert", ("bert-encoder", "distilled"), tokens(30522),
                 transformers_model("DistilBertModel", "DistilBertConfig")),
    _transformer("gpt2", ("causal-decoder",), tokens(50257),
                 transformers_model("GPT2Model", "GPT2Config", use_cache=False)),
    _transformer("llama_small", ("causal-decoder", "rmsnorm-rotary-swiglu-gqa"), tokens(32000),
                 transformers_model("LlamaModel", "LlamaConfig", **_LLAMA)),
    _transformer("t5_encoder", ("t5-encoder", "relative-position-bias"), tokens(32128),
                 transformers_model("T5EncoderModel", "T5Config", **_T5)),
    _transformer("vit_b_16", ("vision-transformer",), image(), torchvision_model("vit_b_16")),
    _transformer("swin_t", ("windowed-attention", "vision-transformer"), image(), torchvision_model("swin_t")),
    _transformer("deit_small", ("vision-transformer", "timm-vit"), image(), timm_model("deit_small_patch16_224")),
    _transformer("dinov2_small", ("vision-transformer", "timm-vit", "layerscale"), image(),
                 timm_model("vit_small_patch14_dinov2", img_size=224)),
    _transformer("whisper_encoder", ("speech-encoder", "conv-frontend"), (InputSpec("input_features", (80, 3000)),),
                 transformers_model("whisper.modeling_whisper.WhisperEncoder", "WhisperConfig", **_WHISPER)),
    _transformer("wav2vec2_base", ("speech-encoder", "conv-frontend", "groupnorm"),
                 (InputSpec("input_values", (80000,)),), transformers_model("Wav2Vec2Model", "Wav2Vec2Config")),
    _video("r3d_18", ("3d-conv", "residual"), video_model("r3d_18")),
    _video("r2plus1d_18", ("2plus1d-conv", "residual"), video_model("r2plus1d_18")),
)
BY_NAME = {m.name: m for m in MODELS}


def make_inputs(model: ZooModel, batch: int, torch, seed: int | None = None) -> dict[str, Any]:
    """The model's inputs at `batch` (CPU tensors), from a generator seeded by `seed` (default: the batch)."""
    g = torch.Generator().manual_seed(batch if seed is None else seed)
    out = {}
    for spec in model.inputs:
        shape = (batch, *spec.shape)
        if spec.kind == "ids":
            out[spec.name] = torch.randint(0, spec.high, shape, generator=g)
        elif spec.kind == "ones":
            out[spec.name] = torch.ones(shape, dtype=torch.int64)
        else:
            out[spec.name] = torch.randn(shape, generator=g)
    return out


CALIBRATION_BATCH, CALIBRATION_SEED = 4, 1_000_003


def prepare(model: ZooModel, module, torch):
    """`module` with zero-initialized weight tensors re-drawn from N(0, 0.02) and BatchNorm running
    statistics estimated on two random batches (cumulative average), back in eval mode."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative moving average over the calibration batches
            bn.train()
        with torch.no_grad():
            for i in range(2):
                module(**make_inputs(model, CALIBRATION_BATCH, torch, seed=CALIBRATION_SEED + i))
    return module.eval()
