"""Small ONNX graphs with the layout `vla export policy` writes (inputs, metadata), built with
onnx.helper: tests of the runtime run without torch and without the seconds an export takes."""

from __future__ import annotations

import json

import numpy as np


def toy_policy(path: str, cameras=("front", "wrist"), size: int = 64, horizon: int = 4, scale: float = 0.01,
               instructions=("pick up the red cube",), exec_steps: int = 2, extra_meta: dict | None = None) -> str:
    """actions[b, h, a] = scale * tanh(noise + mean(state) + mean(images) / 255 + instruction): every input
    reaches the output, the chunk stays within +-scale (metres / radians per tick)."""
    from onnx import TensorProto, helper, numpy_helper, save

    nodes, inits = [], [numpy_helper.from_array(np.array(scale, np.float32), "scale"),
                        numpy_helper.from_array(np.array(255.0, np.float32), "c255"),
                        numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "b11")]
    terms = ["noise"]
    for c in cameras:
        nodes += [helper.make_node("Cast", [f"image_{c}"], [f"f_{c}"], to=TensorProto.FLOAT),
                  helper.make_node("ReduceMean", [f"f_{c}"], [f"m_{c}"], axes=[1, 2, 3], keepdims=1),
                  helper.make_node("Reshape", [f"m_{c}", "b11"], [f"r_{c}"]),
                  helper.make_node("Div", [f"r_{c}", "c255"], [f"n_{c}"])]
        terms.append(f"n_{c}")
    nodes += [helper.make_node("ReduceMean", ["state"], ["ms"], axes=[1], keepdims=1),
              helper.make_node("Unsqueeze", ["ms", "ax2"], ["ms3"]),
              helper.make_node("Cast", ["instruction"], ["fi"], to=TensorProto.FLOAT),
              helper.make_node("Unsqueeze", ["fi", "ax12"], ["fi3"])]
    inits += [numpy_helper.from_array(np.array([2], np.int64), "ax2"),
              numpy_helper.from_array(np.array([1, 2], np.int64), "ax12")]
    terms += ["ms3", "fi3"]
    acc = terms[0]
    for i, t in enumerate(terms[1:]):
        nodes.append(helper.make_node("Add", [acc, t], [f"acc{i}"]))
        acc = f"acc{i}"
    nodes += [helper.make_node("Tanh", [acc], ["th"]), helper.make_node("Mul", ["th", "scale"], ["actions"])]
    inputs = [helper.make_tensor_value_info(f"image_{c}", TensorProto.UINT8, ["batch", size, size, 3]) for c in cameras]
    inputs += [helper.make_tensor_value_info("state", TensorProto.FLOAT, ["batch", 8]),
               helper.make_tensor_value_info("instruction", TensorProto.INT64, ["batch"]),
               helper.make_tensor_value_info("noise", TensorProto.FLOAT, ["batch", horizon, 7])]
    graph = helper.make_graph(nodes, "toy", inputs,
                              [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", horizon, 7])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    meta = {"format": 1, "kind": "toy", "cameras": list(cameras), "image_size": size, "crops": {},
            "instructions": list(instructions), "horizon": horizon, "action_dim": 7, "state_dim": 8,
            "exec_steps": exec_steps, **(extra_meta or {})}
    for k, v in meta.items():
        p = model.metadata_props.add()
        p.key, p.value = k, json.dumps(v)
    save(model, path)
    return path
