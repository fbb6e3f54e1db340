"""Export a torch module to ONNX the way polykit's model benchmarks do: the TorchScript exporter
(`dynamo=False`), opset 21, the inputs named as given, one output named "out"."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Mapping

OPSET = 21


def export_onnx(module, inputs: Mapping[str, Any], path: str | Path, torch) -> None:
    """Write `module` called on the values of `inputs` (positionally, in order) to `path`."""
    with warnings.catch_warnings():  # the exporter's deprecation and opset notes, once per model
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(inputs.values()), str(path), input_names=list(inputs), output_names=["out"],
                          opset_version=OPSET, dynamo=False)


def first_tensor(output: Any) -> Any:
    """The tensor a model's output leads with: itself, `out` of a dict (torchvision's segmentation
    models), the first value of a mapping (a transformers ModelOutput: last_hidden_state) or of a
    tuple."""
    if isinstance(output, Mapping):
        return first_tensor(output["out"] if "out" in output else next(iter(output.values())))
    if isinstance(output, (tuple, list)):
        return first_tensor(output[0])
    return output


def single_output(model, names: tuple[str, ...], torch):
    """`model` as a module of positional tensors (`names` in order, passed as keywords) that
    returns one tensor (`first_tensor` of its output): one signature for export, eager and compile."""

    class SingleOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return first_tensor(self.model(**dict(zip(names, tensors))))

    return SingleOutput().eval()
