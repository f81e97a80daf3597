"""Tiny random-weight masked LMs built on this machine, deterministically, never downloaded.

transformers 5 ignores tokenizer file paths given as keywords (it builds a tokenizer of special
tokens only, and every word becomes unknown), so paths are passed positionally and each built
tokenizer is checked for length and a round trip.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
from tokenizers.processors import TemplateProcessing
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    BertTokenizerFast,
    DistilBertConfig,
    DistilBertForMaskedLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaTokenizerFast,
    XLMRobertaConfig,
    XLMRobertaForMaskedLM,
)

WORDS = [
    "the",
    "a",
    "an",
    "is",
    "was",
    "of",
    "and",
    "to",
    "in",
    "on",
    "at",
    "for",
    "with",
    "by",
    "from",
    "paris",
    "france",
    "capital",
    "city",
    "country",
    "river",
    "london",
    "england",
    "berlin",
    "germany",
    "rome",
    "italy",
    "madrid",
    "spain",
    "big",
    "small",
    "old",
    "new",
    "good",
    "bad",
    "red",
    "blue",
    "green",
    "cat",
    "dog",
    "bird",
    "fish",
    "horse",
    "cow",
    "house",
    "car",
    "road",
    "tree",
    "sky",
    "sun",
    "moon",
    "star",
    "water",
    "fire",
    "earth",
    "air",
    "day",
    "night",
    "man",
    "woman",
    "child",
    "king",
    "queen",
    "people",
    "time",
    "year",
    "way",
    "world",
    "life",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "runs",
    "walks",
    "eats",
    "sleeps",
    "sings",
    "reads",
    "writes",
    ".",
    ",",
    "!",
    "?",
]

CORPUS = [
    "paris is the capital of france.",
    "the quick brown fox jumps over the lazy dog.",
    "london is a big city in england on a river.",
    "a small cat sleeps in the old house at night.",
    "the king and the queen walk to the green tree.",
] * 20

# A text of three times the test models' length (128 tokens) with a mask near each end: too far
# apart to share a window, so the model reads it in two.
# A small shape every encoder type of transformers accepts, for tests that build one from its
# config alone (no tokenizer): three layers, so that a last layer has layers before it.
SMALL_ENCODER = {
    "vocab_size": 120,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
}
# Encoders whose last layer has BERT's post-norm layout, which every backend computes at the read
# rows only (engine/last_layer.py), as transformers builds them.
READ_ROWS_LAYOUTS = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "data2vec-text")
LONG_TEXT = "the [MASK] sat. " + "the dog ran in the park. " * 60 + "the cat sat on the [MASK]."


def _readable(model: torch.nn.Module, special_ids: list[int]) -> None:
    """Random models favour special tokens (shown as empty strings); push those down."""
    bias = model.get_output_embeddings().bias
    with torch.no_grad():
        bias[special_ids] = -20.0


def build_bert(
    folder: Path, *, seed: int = 0, with_head: bool = True, subwords: tuple[str, ...] = (), **shape: int
) -> Path:
    """The tiny BERT; ``subwords`` ("##s") add WordPiece continuations, so some words take several
    tokens; ``shape`` (``hidden_size=512``...) makes it larger where a test needs its weights to weigh."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS)) + list(subwords)
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(str(vocab_file), do_lower_case=True)  # positional path: see the module docstring
    assert len(tokenizer) == len(vocab), "tokenizer built without its vocabulary"
    assert tokenizer.decode(tokenizer("paris is the capital")["input_ids"], skip_special_tokens=True) == (
        "paris is the capital"
    )
    tokenizer.save_pretrained(folder)
    config = BertConfig(
        **{
            "vocab_size": len(vocab),
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 128,
            **shape,
        }
    )
    torch.manual_seed(seed)
    if with_head:
        model = BertForMaskedLM(config)
        _readable(model, [0, 1, 2, 3, 4])
    else:
        model = BertModel(config)
    model.save_pretrained(folder)
    return folder


def _save_roberta_body(
    folder: Path,
    model_class: type[PreTrainedModel],
    config_class: Callable[..., PretrainedConfig],
    vocab_size: int,
    seed: int,
) -> Path:
    """A tiny RoBERTa-shaped masked LM (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2), saved beside its tokenizer."""
    config = config_class(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        type_vocab_size=1,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    _readable(model, [0, 1, 2, 3, 4])
    model.save_pretrained(folder)
    return folder


def build_roberta(folder: Path, *, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS + [" ".join(WORDS)], vocab_size=400, min_frequency=1, special_tokens=specials)
    bpe.save_model(str(folder))
    tokenizer = RobertaTokenizerFast(
        str(folder / "vocab.json"), str(folder / "merges.txt")
    )  # positional: see the module docstring
    assert len(tokenizer) == len(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    assert tokenizer.decode(tokenizer(" paris is the capital")["input_ids"], skip_special_tokens=True) == (
        " paris is the capital"
    )
    tokenizer.save_pretrained(folder)
    return _save_roberta_body(folder, RobertaForMaskedLM, RobertaConfig, len(tokenizer), seed)


def build_xlmr(folder: Path, *, seed: int = 0) -> Path:
    """An XLM-R-style model: a SentencePiece Unigram tokenizer trained here, ``<s> ... </s>``, RoBERTa's body."""
    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(
        CORPUS + [" ".join(WORDS)], vocab_size=300, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    unigram.post_processor = TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=unigram,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(5)] == specials
    assert tokenizer.decode(tokenizer("paris is the capital")["input_ids"], skip_special_tokens=True) == (
        "paris is the capital"
    )
    tokenizer.save_pretrained(folder)
    return _save_roberta_body(folder, XLMRobertaForMaskedLM, XLMRobertaConfig, len(tokenizer), seed)


def build_maskless(folder: Path) -> Path:
    """A BERT whose tokenizer has no mask token: it must be refused at start-up.

    ``BertTokenizer`` (4.x and 5.x) brings ``[MASK]`` as a class default, so the folder names the
    generic ``PreTrainedTokenizerFast`` instead and drops ``mask_token`` from every file.
    """
    build_bert(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config.pop("mask_token", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    special_file = folder / "special_tokens_map.json"
    if special_file.exists():
        special = json.loads(special_file.read_text(encoding="utf-8"))
        special.pop("mask_token", None)
        special_file.write_text(json.dumps(special), encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.mask_token is None and tokenizer.pad_token == "[PAD]", "the mask token survived"
    return folder


def build_distilbert(folder: Path, *, seed: int = 0) -> Path:
    """A tiny DistilBERT beside the tiny BERT's tokenizer: a layout whose last layer is not BERT's."""
    build_bert(folder, seed=seed)
    vocab_size = len((folder / "vocab.txt").read_text(encoding="utf-8").splitlines())
    for stale in folder.glob("*.safetensors"):
        stale.unlink()
    config = DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
    torch.manual_seed(seed)
    model = DistilBertForMaskedLM(config)
    _readable(model, [0, 1, 2, 3, 4])
    model.save_pretrained(folder)
    return folder
