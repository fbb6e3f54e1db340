"""Export the small PyTorch reference models the accuracy tests run (random weights).

Run by hand where torch and transformers are installed; the exported .onnx files (all
small) are committed under tests/data/torch/ so the tests need neither package:

    python3 tests/data/make_torch_models.py

Both torch.onnx exporters are used: the TorchScript one (dynamo=False) and the
torch.export-based one (dynamo=True). One model is saved with external data.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

OUT = Path(__file__).parent / "torch"


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + x)


class ConvNet(nn.Module):
    """A small ResNet-style net: conv/BN/ReLU, residual blocks, strided conv, pooling, linear."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(Block(16), nn.Conv2d(16, 32, 3, stride=2, padding=1), Block(32))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def _randomize_bn(model):
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def export(model, args, name, dynamo, input_names, output_names, external_data=False, **kw):
    path = OUT / f"{name}_{'dynamo' if dynamo else 'ts'}.onnx"
    model.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            prog = torch.onnx.export(model, args, dynamo=True, input_names=input_names,
                                     output_names=output_names, **kw)
            prog.save(str(path), external_data=external_data)
        else:
            torch.onnx.export(model, args, str(path), dynamo=False, input_names=input_names,
                              output_names=output_names, opset_version=17, **kw)
    print("wrote", path, path.stat().st_size)


def main():
    import transformers as tf

    OUT.mkdir(exist_ok=True)
    torch.manual_seed(0)
    conv = ConvNet()
    _randomize_bn(conv)
    x = torch.randn(2, 3, 32, 32)
    for dyn in (False, True):
        export(conv, (x,), "convnet", dyn, ["image"], ["logits"])
    export(conv, (x,), "convnet_extdata", True, ["image"], ["logits"], external_data=True)

    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    bert = tf.BertModel(tf.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=128, max_position_embeddings=64))

    class BertWrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    for dyn in (False, True):
        export(BertWrap(bert), (ids, mask), "bert_tiny", dyn, ["input_ids", "attention_mask"], ["last_hidden_state"])

    gpt2 = tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=2, n_positions=64))

    class GptWrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            # An explicit mask keeps transformers' mask helpers off aten::diff, which the
            # TorchScript exporter cannot export.
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    for dyn in (False, True):
        export(GptWrap(gpt2), (ids, mask), "gpt2_tiny", dyn, ["input_ids", "attention_mask"], ["last_hidden_state"])

    vit = tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=128), add_pooling_layer=False)

    class VitWrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values).last_hidden_state

    for dyn in (False, True):
        export(VitWrap(vit), (torch.randn(2, 3, 32, 32),), "vit_tiny", dyn, ["pixel_values"], ["last_hidden_state"])


if __name__ == "__main__":
    main()
