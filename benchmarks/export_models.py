"""Export torchvision ResNet-50 and HuggingFace BERT-base (random weights) to ONNX.

    PYTHONPATH=. python3 benchmarks/export_models.py OUT_DIR [--batch 1]

Writes OUT_DIR/resnet50.onnx (input "x": [B,3,224,224]) and OUT_DIR/bert_base.onnx
(inputs "input_ids", "attention_mask": [B,128]), TorchScript exporter, opset 21 -- the
same export benchmarks/cuda_models.py times. Used for the cuda acceptance runs
(`polykit run OUT_DIR/resnet50.onnx --trt --onnxrt --target cuda`).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cuda_models import export, make_inputs, make_model  # noqa: E402


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, file in (("resnet50", "resnet50.onnx"), ("bert", "bert_base.onnx")):
            export(name, make_model(name, torch), make_inputs(name, args.batch, torch), out / file, torch)
            print("wrote", out / file, flush=True)


if __name__ == "__main__":
    main()
