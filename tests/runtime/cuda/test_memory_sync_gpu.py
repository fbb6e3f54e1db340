"""GPU: a copy or memset without a stream has landed when it returns, so work on any
non-blocking stream (the runtime's, a user's) that follows sees its bytes. cuMemsetD8 and
cuMemcpyDtoD return at once and pageable cuMemcpyHtoD may return before its DMA lands, and
non-blocking streams do not wait for the legacy stream: before memory._finished, weights
uploaded at engine load and harness poison fills could race the first kernels."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

NBYTES = 256 << 20  # large enough that a copy or memset still running would be seen


def _read_on_other_stream(ptr: int) -> np.ndarray:
    from polykit.runtime.cuda.memory import download
    from polykit.runtime.cuda.stream import Stream

    stream = Stream()  # non-blocking: it does not wait for the legacy stream
    try:
        return download(ptr, (NBYTES,), np.uint8, stream.handle)
    finally:
        stream.close()


@pytest.mark.parametrize("op", ["fill_bytes", "upload", "copy_device"])
def test_a_streamless_copy_or_memset_has_landed_for_other_streams(op):
    from polykit.runtime.cuda import driver
    from polykit.runtime.cuda.memory import DeviceBuffer, copy_device, fill_bytes, upload

    driver.current_device()
    with DeviceBuffer(NBYTES) as dst, DeviceBuffer(NBYTES) as src:
        fill_bytes(dst.ptr, NBYTES, 0x00)
        want = (np.arange(NBYTES, dtype=np.uint32) * 2654435761 >> 24).astype(np.uint8)
        driver.synchronize()
        if op == "fill_bytes":
            want[:] = 0xA5
            fill_bytes(dst.ptr, NBYTES, 0xA5)
        elif op == "upload":
            upload(dst.ptr, want)
        else:
            upload(src.ptr, want)
            copy_device(dst.ptr, src.ptr, NBYTES)
        got = _read_on_other_stream(dst.ptr)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{op}: {bad.size} bytes not yet written when read on another stream, first at {bad[0]}"
