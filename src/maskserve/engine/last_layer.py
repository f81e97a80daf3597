"""The last encoder layer at the read rows only: its other rows feed nothing.

The MLM head reads a few rows of the last layer's output: a fill-mask text's masks, a scoring
copy's one answer row. Every other row of that layer is computed only to be thrown away. Its keys
and values still need every row (the read rows attend to them), but its queries, attention output,
feed-forward and norms need only the read rows. In a 12-layer encoder that is most of a twelfth
of the work; in a 2-layer one, most of a half.

This knows the post-norm layer of BERT and its descendants (RoBERTa, XLM-R, ELECTRA, CamemBERT,
Data2VecText): a layer with ``attention.self.{query,key,value}``, ``attention.output``,
``intermediate`` and ``output``. Other layouts get ``None`` from :meth:`ReadRowsLastLayer.find`.
The torch backend runs it eagerly; the graph backends trace it into their graph
(onnx_export.MaskLogitsGraph), so it is written in plain tensor operations that export. Either
keeps it only if it gives the whole model's answers on a probe batch, within the bound of the
precision it runs in (probe.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch


class _LastLayerReached(Exception):
    """Carries the last layer's input out of the encoder, which then stops: nothing after it is needed."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden


def _stop_at_last_layer(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    raise _LastLayerReached(args[0] if args else kwargs["hidden_states"])


def rows_at(hidden: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``hidden`` (batch, length, width) at each row's ``columns`` (batch, reads): (batch, reads, width)."""
    return torch.gather(hidden, 1, columns[:, :, None].expand(-1, -1, hidden.shape[-1]))


class ReadRowsLastLayer:
    """Runs an encoder with its last layer computed at the read rows only."""

    def __init__(self, encoder: torch.nn.Module, last: Any) -> None:
        # ``last`` is any module of the layout find() checked: its parts are reached by name.
        self.encoder = encoder
        self.last: torch.nn.Module = last
        self.query: torch.nn.Module = last.attention.self.query
        self.key: torch.nn.Module = last.attention.self.key
        self.value: torch.nn.Module = last.attention.self.value
        self.attention_output: torch.nn.Module = last.attention.output
        self.intermediate: torch.nn.Module = last.intermediate
        self.output: torch.nn.Module = last.output
        self.heads = int(last.attention.self.num_attention_heads)
        self.head_size = int(last.attention.self.attention_head_size)

    @classmethod
    def find(cls, encoder: torch.nn.Module) -> ReadRowsLastLayer | None:
        """One for ``encoder`` (the model without its head) if its last layer has exactly the known layout.

        Exactly: a module more (a relative-position table, a pre-norm, cross-attention) is a term
        the sum computed here would leave out.
        """
        layers = getattr(getattr(encoder, "encoder", None), "layer", None)
        if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
            return None
        last: Any = layers[-1]
        layout = {
            last: ({"attention", "intermediate", "output"}, set()),
            getattr(last, "attention", None): ({"self", "output"}, set()),
            getattr(getattr(last, "attention", None), "self", None): ({"query", "key", "value"}, {"dropout"}),
            getattr(getattr(last, "attention", None), "output", None): ({"dense", "LayerNorm"}, {"dropout"}),
            getattr(last, "intermediate", None): ({"dense"}, {"intermediate_act_fn"}),
            getattr(last, "output", None): ({"dense", "LayerNorm"}, {"dropout"}),
        }
        for module, (needed, allowed) in layout.items():
            if not isinstance(module, torch.nn.Module):
                return None
            children = {name for name, _ in module.named_children()}
            if not needed <= children <= needed | allowed:
                return None
        attention = last.attention.self
        known = (
            hasattr(attention, "num_attention_heads")
            and hasattr(attention, "attention_head_size")
            and getattr(attention, "position_embedding_type", "absolute") == "absolute"
            and not getattr(last, "is_decoder", False)
            # A chunked feed-forward runs the same sum in slices; it is left to the whole layer.
            and not getattr(last, "chunk_size_feed_forward", 0)
        )
        return cls(encoder, last) if known else None

    def __call__(
        self, ids: torch.Tensor, attention: torch.Tensor, columns: torch.Tensor, index: torch.Tensor
    ) -> torch.Tensor:
        """The encoder's output at the read positions: ``columns`` and ``index`` of a
        :class:`~maskserve.engine.read_rows.ReadRows`, one row per asked position, in its order.

        Plain tensor operations only, so that the same code runs eagerly and traces into the
        exported graphs (onnx_export.MaskLogitsGraph).
        """
        hidden = self._input_of_last_layer(ids, attention)
        read = rows_at(hidden, columns)
        batch, width = columns.shape
        query = self._heads(self.query(read))
        key = self._heads(self.key(hidden))
        value = self._heads(self.value(hidden))
        # Attention written out, with an additive mask as the encoder's eager layers build it:
        # every exporter and runtime translates these operations alike (a boolean mask given to a
        # fused attention was turned into NaN by one OpenVINO release), and at a few read rows
        # a fused kernel would save nothing.
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_size)
        padding = (1.0 - attention[:, None, None, :].to(scores.dtype)) * torch.finfo(scores.dtype).min
        context = torch.matmul((scores + padding).softmax(dim=-1), value)
        context = context.transpose(1, 2).reshape(batch, width, self.heads * self.head_size)
        attended = self.attention_output(context, read)
        output: torch.Tensor = self.output(self.intermediate(attended), attended)
        return output.reshape(batch * width, -1).index_select(0, index)

    def _heads(self, projected: torch.Tensor) -> torch.Tensor:
        batch, length, _ = projected.shape
        return projected.reshape(batch, length, self.heads, self.head_size).transpose(1, 2)

    def _input_of_last_layer(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """The hidden states entering the last layer, from the encoder's own forward.

        The encoder builds its embeddings and attention masks itself, in whatever form its
        version uses; a hook on the last layer takes its input and stops the forward there.
        The hook lives for this one call, on a module only the inference thread runs (the
        load-time probe runs before serving starts), so no other forward can meet it.
        """
        handle = self.last.register_forward_pre_hook(_stop_at_last_layer, with_kwargs=True)
        try:
            self.encoder(input_ids=ids, attention_mask=attention)
        except _LastLayerReached as reached:
            return reached.hidden
        finally:
            handle.remove()
        raise AssertionError("the encoder returned without running its last layer; this is a bug")
