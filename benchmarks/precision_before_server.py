"""maskserve with a reduced precision's graph as it was before, for benchmarks.precision_rates.

    python -m benchmarks.precision_before_server bf16-whole --model DIR --backend openvino --dtype bfloat16
    python -m benchmarks.precision_before_server int8-before --model DIR --backend openvino --quantize int8

``bf16-whole``: the whole graph in bfloat16 (today the last layer and the head run in float32).
``int8-before``: the `vnni` recipe before the last layer's read rows were kept in float32 (7-bit
weights past the first layer, no full bias correction). The rest is maskserve's own flags.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from maskserve.__main__ import main
from maskserve.engine import openvino
from maskserve.engine.openvino_quantize import Int8Recipe

from .precision_parts import before


def whole_bfloat16(model_file: Path, threads: int, *, keep_compiled: bool = True) -> Any:
    return openvino.compile_graph(model_file, "bf16", threads, keep_compiled=keep_compiled)


def int8_before(flags: frozenset[str] | None = None) -> Int8Recipe:
    recipe: Int8Recipe = before()
    return recipe


VARIANTS = {"bf16-whole": ("compile_bfloat16", whole_bfloat16), "int8-before": ("recipe_for", int8_before)}

if __name__ == "__main__":
    name, *rest = sys.argv[1:]
    attribute, replacement = VARIANTS[name]
    setattr(openvino, attribute, replacement)
    sys.exit(main(rest))
