#!/usr/bin/python3
"""Llama 3's RoPE inverse frequencies, as Hugging Face transformers'
_compute_llama3_parameters computes them (modeling_rope_utils.py), in
numpy float64: the independent reference of tests/test_ops.c's scaled
rope case and of tests/hf_export_check.py's forward.

  rope_llama3_ref.py THETA HEAD_SIZE FACTOR LOW HIGH ORIGINAL_MAX
prints one inverse frequency per pair, %.17g.
"""
import sys

import numpy as np


def llama3_inv_freq(theta, hs, factor, low, high, original_max):
    inv_freq = 1.0 / theta ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
    low_freq_wavelen = original_max / low
    high_freq_wavelen = original_max / high
    wavelen = 2 * np.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, inv_freq_llama)


if __name__ == "__main__":
    a = [float(x) for x in sys.argv[1:7]]
    for f in llama3_inv_freq(a[0], int(a[1]), *a[2:]):
        print("%.17g" % f)
