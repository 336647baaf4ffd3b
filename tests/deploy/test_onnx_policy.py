import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from deploy.runtime import OnnxPolicy, run_episodes  # noqa: E402


def _linear_policy(path, W, H=4, A=7):
    """state [B,8] @ W [8, H*A] + mean(image) -> reshape [B,H,A] (+ noise)."""
    g = helper.make_graph(
        [helper.make_node("MatMul", ["state", "W"], ["m"]),
         helper.make_node("ReduceMean", ["image_front"], ["im"], keepdims=0),
         helper.make_node("Reshape", ["im", "one"], ["im2"]),
         helper.make_node("Add", ["m", "im2"], ["y"]),
         helper.make_node("Reshape", ["y", "shape"], ["chunk0"]),
         helper.make_node("Add", ["chunk0", "noise"], ["chunk"])],
        "lin",
        [helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("image_front", TensorProto.FLOAT, [1, 3, 16, 16]),
         helper.make_tensor_value_info("noise", TensorProto.FLOAT, [1, H, A])],
        [helper.make_tensor_value_info("chunk", TensorProto.FLOAT, [1, H, A])],
        [numpy_helper.from_array(W.astype(np.float32), "W"),
         numpy_helper.from_array(np.array([1, 1], np.int64), "one"),
         numpy_helper.from_array(np.array([1, H, A], np.int64), "shape")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def test_onnx_policy_matches_numpy(tmp_path):
    rng = np.random.default_rng(0)
    W = rng.normal(size=(8, 28))
    path = str(tmp_path / "p.onnx")
    _linear_policy(path, W)
    pol = OnnxPolicy(path)
    obs = {"state": rng.normal(size=8).astype(np.float32),
           "images": {"front": np.full((32, 32, 3), 51, np.uint8)}}  # resized to 16x16, value 0.2
    noise = rng.normal(size=(4, 7)).astype(np.float32)
    out = pol(obs, noise=noise)
    expected = (obs["state"] @ W + 0.2).reshape(4, 7) + noise
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    # same noise -> same chunk; sampled noise differs between calls
    np.testing.assert_array_equal(pol(obs, noise=noise), out)
    assert not np.allclose(pol(obs), pol(obs))


def test_onnx_policy_refuses_what_it_cannot_feed(tmp_path):
    path = str(tmp_path / "p.onnx")
    _linear_policy(path, np.zeros((8, 28)))
    pol = OnnxPolicy(path)
    with pytest.raises(ValueError, match="camera 'front'"):
        pol({"state": np.zeros(8, np.float32), "images": {"wrist": np.zeros((16, 16, 3), np.uint8)}})
    with pytest.raises(ValueError, match=r"wants \[8\]"):
        pol({"state": np.zeros(5, np.float32), "images": {"front": np.zeros((16, 16, 3), np.uint8)}})
    with pytest.raises(FileNotFoundError):
        OnnxPolicy(str(tmp_path / "missing.onnx"))


class _CountEnv:
    def reset(self, seed=None):
        self.t = 0
        return {"state": np.zeros(8, np.float32)}, {}

    def step(self, chunk):
        assert chunk.shape == (4, 7)
        self.t += 1
        return {"state": np.zeros(8, np.float32)}, 1.0, self.t >= 3, False, {"success": self.t >= 3}


def test_run_episodes_loop():
    res = run_episodes(_CountEnv(), lambda o: np.zeros((4, 7), np.float32), episodes=2, max_steps=10)
    assert [r["steps"] for r in res] == [3, 3] and all(r["success"] for r in res) and res[0]["return"] == 3.0


def test_the_gripper_metadata_is_read_and_checked(tmp_path):
    """`vla export policy` records the checkpoint's executed opening as metadata 'gripper'; the runtime reads it
    for `vla-edge --gripper auto`, refuses a value it does not know by name, and a file without it says None."""
    from tests.deploy.graphs import toy_policy

    assert OnnxPolicy(toy_policy(str(tmp_path / "b.onnx"), extra_meta={"gripper": "binary"})).gripper == "binary"
    assert OnnxPolicy(toy_policy(str(tmp_path / "n.onnx"))).gripper is None
    with pytest.raises(ValueError, match="policy metadata 'gripper' 'half'"):
        OnnxPolicy(toy_policy(str(tmp_path / "h.onnx"), extra_meta={"gripper": "half"}))
    pytest.importorskip("torch")  # vla's side: `vla eval --gripper auto` on an exported file
    from vla.envs import checkpoint_gripper, resolve_gripper

    assert checkpoint_gripper(str(tmp_path / "b.onnx")) == "binary"
    assert resolve_gripper("auto", str(tmp_path / "n.onnx")) == "raw"
