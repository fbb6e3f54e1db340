"""The count words of a cuda context: one int64 device word per layer whose output size depends
on values (polykit.runtime.output_alloc). The layer's kernels write the size there; the word is
cleared on the layer's stream before each launch (a kernel that finds nothing to do leaves 0)
and read back after it: one synchronization per such layer and run."""

from __future__ import annotations

from typing import Any, MutableMapping, Sequence

import numpy as np

from polykit.kernels.cuda.base import DeviceTensor, count_slot
from polykit.runtime.cuda.memory import DeviceBuffer, download, fill_bytes
from polykit.runtime.output_alloc import DataOutput, data_outputs

WORD = 8


class CountWords:
    """The words of `plan`'s deciding layers, entered into `tensors` under count_slot(layer)."""

    def __init__(self, plan: Any, tensors: MutableMapping[str, DeviceTensor], allocator: Any = None):
        layers = sorted({o.layer for o in data_outputs(plan)})
        self.buffer = DeviceBuffer(WORD * len(layers), what="output size counts", allocator=allocator)
        self.words = {index: self.buffer.ptr + WORD * k for k, index in enumerate(layers)}
        for index, ptr in self.words.items():
            tensors[count_slot(plan.layers[index].name)] = DeviceTensor(ptr, (1,), np.dtype(np.int64))

    def clear(self, layer: int, stream: Any) -> None:
        """Zero layer `layer`'s word on `stream` (before its launch), if it has one."""
        ptr = self.words.get(layer)
        if ptr is not None:
            fill_bytes(ptr, WORD, 0, stream.handle)

    def read(self, outputs: Sequence[DataOutput], stream: Any) -> dict[str, int]:
        """{symbol: size} of `outputs` (all of one layer), read back after `stream`'s work."""
        sizes: dict[int, int] = {}
        for o in outputs:
            if o.layer not in sizes:
                sizes[o.layer] = int(download(self.words[o.layer], (1,), np.int64, stream.handle)[0])
        return {o.symbol: sizes[o.layer] for o in outputs}

    def free(self) -> None:
        self.buffer.free()
