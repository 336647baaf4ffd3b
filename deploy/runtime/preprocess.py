"""Camera frames -> what an exported graph reads, in numpy (no torch): the same crop and the same
antialiased bilinear resize as ``vla.models.encoders.crop_uint8`` / ``resize_uint8``, so the edge
runner feeds the exported VLA the pixels it was trained on.

The resize is separable: ``out[c] = Wy @ img[c] @ Wx.T`` with the triangle-filter weights of
torch's ``interpolate(mode="bilinear", antialias=True, align_corners=False)`` (PIL's BILINEAR
when shrinking). The weight matrices depend only on the sizes and are cached.
"""

from __future__ import annotations

import functools

import numpy as np


def crop_uint8(image: np.ndarray, box) -> np.ndarray:
    """uint8 [H, W, 3] -> the region ``box = (x0, y0, x1, y1)`` (fractions of width and height)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    h, w = image.shape[0], image.shape[1]
    c0, c1 = int(round(x0 * w)), int(round(x1 * w))
    r0, r1 = int(round(y0 * h)), int(round(y1 * h))
    if not (0 <= c0 < c1 <= w and 0 <= r0 < r1 <= h):
        raise ValueError(f"crop box {tuple(box)} is not a region of a {w}x{h} image "
                         "(x0 < x1 and y0 < y1, fractions in [0, 1])")
    return image[r0:r1, c0:c1]


@functools.lru_cache(maxsize=32)
def resize_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] float32 weights of torch's antialiased bilinear resize along one axis
    (``_compute_indices_weights_aa`` in ATen: a triangle filter widened by the scale when shrinking)."""
    scale = n_in / n_out
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    w = np.zeros((n_out, n_in), np.float64)
    for i in range(n_out):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), n_in)
        j = np.arange(xmin, xmax)
        k = np.clip(1.0 - np.abs((j - center + 0.5) * invscale), 0.0, None)
        total = k.sum()
        w[i, xmin:xmax] = k / total if total > 0 else 0.0
    return w.astype(np.float32)


def resize_uint8(image: np.ndarray, size: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [size, size, 3], antialiased bilinear, rounded as torch rounds it."""
    h, w = image.shape[0], image.shape[1]
    if h == size and w == size:
        return image
    wy, wx = resize_weights(h, size), resize_weights(w, size)
    x = image.astype(np.float32).reshape(h, -1)
    x = (wy @ x).reshape(size, w, -1)  # rows: [size, W * 3] through BLAS
    x = wx @ x  # columns, batched over the output rows: [size, size, 3]
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def camera_input(image: np.ndarray, size: int, box=None) -> np.ndarray:
    """One camera frame -> the exported graph's ``image_<camera>`` row: crop (if the model has a
    region of interest for that camera), then resize to ``size``. uint8 [size, size, 3]."""
    img = np.asarray(image)
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"a camera frame must be uint8 [H, W, 3], got {img.dtype} {list(img.shape)}")
    if box is not None:
        img = crop_uint8(img, box)
    return resize_uint8(img, size)
