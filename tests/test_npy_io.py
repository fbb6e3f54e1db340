"""polykit.npy_io.open_npz: the ground layer's .npz reader (data files, INT8 calibration
batches, rank processes' arrays) names the file for whatever it cannot read."""

from __future__ import annotations

import numpy as np
import pytest

from polykit import limits
from polykit.errors import DataFileError
from polykit.npy_io import open_npz
from polykit.testing import hostile


def test_an_npz_reads_back_by_name(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.arange(3, dtype=np.int64), y=np.ones((2, 2), np.float16))
    arrays = open_npz(tmp_path / "a.npz")
    assert list(arrays) == ["x", "y"] and arrays["y"].dtype == np.float16


@pytest.mark.parametrize("name, message", [
    ("missing.npz", "missing.npz: the file cannot be read: No such file"),
    ("lone.npz", "lone.npz: the file is a single .npy array"),
    ("text.npz", r"text.npz: the file is not an .npz \(zip\) archive"),
    ("empty.npz", "empty.npz: the archive holds no arrays"),
])
def test_what_is_not_an_npz_is_a_data_file_error_naming_the_file(tmp_path, name, message):
    path = tmp_path / name
    if name == "lone.npz":
        with open(path, "wb") as fh:
            np.save(fh, np.ones(2))
    elif name == "text.npz":
        path.write_text("hello")
    elif name == "empty.npz":
        np.savez(path)
    with pytest.raises(DataFileError, match=message):
        open_npz(path)


@pytest.mark.parametrize("build, message", [
    (hostile.npz_deflate_bomb, r"uncompressed size \(64.0 MiB\) is over the data_bytes limit \(1.0 MiB\)"),
    (hostile.npz_bzip2_bomb, "compressed with method 12; polykit reads stored or deflated members"),
    (hostile.npz_lying_size, "more than its compression can produce"),
    (hostile.npy_huge_shape, r"header says float32\[1099511627776\]"),
])
def test_an_archive_declaring_more_than_it_may_is_refused_before_decompressing(tmp_path, build, message):
    with limits.raised(data_bytes=1 << 20), pytest.raises(DataFileError, match=message):
        open_npz(build(tmp_path))


def test_an_array_over_the_data_limit_is_refused_from_its_header(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros(1024, np.float32))
    with limits.raised(data_bytes=1000), pytest.raises(DataFileError, match="over the data_bytes limit"):
        open_npz(tmp_path / "a.npz")
