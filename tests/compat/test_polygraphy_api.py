"""polykit.compat's Polygraphy API pieces the examples do not reach: CompareFunc's distance and
quality metrics by Polygraphy's definitions, CreateConfig refusing a setting it cannot map."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polykit.compat.polygraphy.backend.trt import CreateConfig, Profile
from polykit.compat.polygraphy.comparator import CompareFunc
from polykit.errors import UsageError

REF = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def test_distance_metrics_are_the_l2_norm_of_the_difference_and_the_cosine_similarity():
    off = REF + np.float32(1e-3)  # L2 norm of the difference: 2e-3
    assert not CompareFunc.distance_metrics()("y", REF, off).passed  # default tolerance 1e-5
    assert CompareFunc.distance_metrics(l2_tolerance=3e-3)("y", REF, off).passed
    assert not CompareFunc.distance_metrics(l2_tolerance={"": 1.0, "y": 1e-3})("y", REF, off).passed
    flipped = CompareFunc.distance_metrics(l2_tolerance=100.0)("y", REF, -REF)  # cosine similarity -1
    assert not flipped.passed and "cosine similarity -1" in flipped.message


def test_quality_metrics_are_psnr_over_the_reference_peak_and_snr():
    act = REF + np.float32(0.01)  # MSE 1e-4: PSNR 20 log10(4) + 40 = 52.04 dB, SNR 10 log10(7.5e4) = 48.75 dB
    psnr, snr = 20 * math.log10(4) + 40, 10 * math.log10(7.5 / 1e-4)
    assert CompareFunc.quality_metrics(psnr_tolerance=psnr - 0.01, snr_tolerance=snr - 0.01)("y", REF, act).passed
    assert not CompareFunc.quality_metrics(psnr_tolerance=psnr + 0.01)("y", REF, act).passed
    assert not CompareFunc.quality_metrics(snr_tolerance=snr + 0.01)("y", REF, act).passed
    assert CompareFunc.quality_metrics(psnr_tolerance=1e9, snr_tolerance=1e9)("y", REF, REF.copy()).passed  # inf dB


def test_create_config_maps_polygraphys_settings_and_refuses_the_rest():
    config = CreateConfig(fp16=True, profiles=[Profile().add("x", min=(1, 2), opt=(2, 2), max=(4, 2))])()
    assert config.fp16 and config.profiles[0].shapes == {"x": ((1, 2), (2, 2), (4, 2))}
    assert CreateConfig(sparse_weights=True)().sparsity == "enable"  # trtexec --sparsity enable
    with pytest.raises(UsageError, match="use_dla"):
        CreateConfig(use_dla=True)
