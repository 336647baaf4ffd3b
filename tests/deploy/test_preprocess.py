"""The edge runtime's numpy crop / resize give the pixels training saw (torch's resize_uint8)."""

import numpy as np
import pytest

from deploy.runtime.preprocess import camera_input, crop_uint8, resize_uint8

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("h,w,size", [(224, 224, 96), (224, 224, 64), (80, 80, 64), (120, 160, 96), (48, 64, 64)])
def test_resize_matches_torch(h, w, size):
    from vla.models.encoders import resize_uint8 as torch_resize

    img = np.random.default_rng(h * w + size).integers(0, 256, (h, w, 3), dtype=np.uint8)
    want = torch_resize(torch.from_numpy(img)[None], size)[0].numpy().astype(int)
    got = resize_uint8(img, size)
    assert got.shape == (size, size, 3) and got.dtype == np.uint8
    diff = np.abs(got.astype(int) - want)
    # float32 sums in another order: a value exactly between two integers may round the other way
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


def test_crop_matches_torch():
    from vla.models.encoders import crop_uint8 as torch_crop

    img = np.random.default_rng(0).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    box = (0.1, 0.25, 0.85, 0.9)
    np.testing.assert_array_equal(crop_uint8(img, box), torch_crop(torch.from_numpy(img)[None], box)[0].numpy())
    with pytest.raises(ValueError, match="not a region"):
        crop_uint8(img, (0.5, 0.2, 0.5, 0.9))


def test_camera_input_refuses_what_is_not_a_frame():
    with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\], got float32"):
        camera_input(np.zeros((64, 64, 3), np.float32), 64)
