"""bfloat16 with the last encoder layer in float32: the graph cut in two, each part compiled apart.

Rounding to bfloat16 moves every layer's output a little, and the answer is decided at the end:
the last layer and the head turn the hidden state into the first tokens' scores, and on short
texts those are often near-ties that a small move swaps. OpenVINO's CPU plugin takes one inference
precision per compiled model (a node marked to keep its precision still ran its products in
bfloat16), so the graph is cut at the last layer's input: the body (embeddings and every layer but
the last) is compiled in bfloat16, the tail (the last layer and the head) in float32, and a batch
runs through one then the other. The tail is one layer of many, most of it at the read rows only.

The cut is the tensor the last layer reads its keys from. A graph whose tail would still hold an
earlier layer (another architecture's naming, a cut that does not separate) is not split: it runs
whole in bfloat16, and the engine's ``last_layer_precision`` says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

HIDDEN_INPUT = "hidden_before_last_layer"
# An encoder layer's operations carry its index in their names, as the exporter writes the module
# path: "...encoder.layer.11.attention.self.key/aten::linear/MatMul".
_LAYER = re.compile(r"\.layer\.(\d+)\.")
_KEY = re.compile(r"attention\.(self\.key|k_lin|key)\b")


def layer_of(node: Any) -> int | None:
    """The index of the encoder layer ``node`` belongs to, by its name; None outside the layers."""
    found = _LAYER.search(node.get_friendly_name())
    return int(found.group(1)) if found else None


def _last_layer_input(model: Any) -> tuple[Any, int] | None:
    """The output the last layer's key projection reads, and that layer's index."""
    matmuls = [op for op in model.get_ordered_ops() if op.get_type_name() == "MatMul" and layer_of(op) is not None]
    if not matmuls:
        return None
    last = max(layer_of(op) or 0 for op in matmuls)
    if last == 0:
        return None  # one layer: its "tail" would be the whole encoder
    for op in matmuls:
        if layer_of(op) == last and _KEY.search(op.get_friendly_name()):
            return op.input_value(0), last
    return None


def _holds_an_earlier_part(model: Any, last: int) -> bool:
    """Whether ``model`` computes anything of the embeddings or of a layer before ``last``. Weights
    do not count: the head's projection is the word embeddings' matrix, shared."""
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant":
            continue
        layer = layer_of(op)
        if (layer is not None and layer < last) or ".embeddings." in op.get_friendly_name():
            return True
    return False


@dataclass(frozen=True)
class GraphParts:
    """The body (up to the last layer's input) and the tail (from there to the logits)."""

    body: Any
    tail: Any


def cut_before_last_layer(model: Any) -> GraphParts | None:
    """``model`` cut at the last layer's input; None where it cannot be. The body shares ``model``'s
    nodes; the tail is cut from a copy, since cutting rewires the graph it is made from."""
    from openvino import Model, PartialShape
    from openvino import opset13 as ops

    found = _last_layer_input(model)
    if found is None:
        return None
    cut, last = found
    body = Model([cut], list(model.get_parameters()), "body")

    rest = model.clone()
    again = _last_layer_input(rest)
    assert again is not None, "a copy of a graph has the same last layer"
    cut = again[0]
    hidden = ops.parameter(
        PartialShape([-1, -1, cut.get_partial_shape()[-1]]), cut.get_element_type(), name=HIDDEN_INPUT
    )
    hidden.output(0).set_names({HIDDEN_INPUT})
    for reader in list(cut.get_target_inputs()):
        reader.replace_source_output(hidden.output(0))
    tail = Model(rest.outputs, [hidden, *rest.get_parameters()], "tail")
    if _holds_an_earlier_part(tail, last):
        return None  # the cut did not separate: the tail would run most of the graph again
    return GraphParts(body, tail)


def _input_names(compiled: Any) -> frozenset[str]:
    return frozenset(name for port in compiled.inputs for name in port.get_names())


class SplitRequest:
    """One batch through the body, then the tail: the logits, as one request of a whole graph."""

    def __init__(self, body: Any, tail: Any) -> None:
        self.body = body.create_infer_request()
        self.tail = tail.create_infer_request()
        self.body_inputs = _input_names(body)
        self.tail_inputs = _input_names(tail)

    def infer(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        hidden = self.body.infer({name: value for name, value in inputs.items() if name in self.body_inputs})[0]
        feed = {name: value for name, value in inputs.items() if name in self.tail_inputs}
        feed[HIDDEN_INPUT] = hidden
        return [self.tail.infer(feed)[0]]


class SplitCompiled:
    """The two compiled parts, used where one compiled graph is: its precision is the body's."""

    def __init__(self, body: Any, tail: Any) -> None:
        self.body = body
        self.tail = tail

    def create_infer_request(self) -> SplitRequest:
        return SplitRequest(self.body, self.tail)

    def get_property(self, name: str) -> Any:
        return self.body.get_property(name)
