"""A fixed, deterministic mix of sentences with one mask each, short to about 100 tokens.

Word counts follow :data:`WORD_COUNTS`: mostly short sentences and a long tail, 23.5 tokens on
average with ``[CLS]``, the full stop and ``[SEP]`` (every word is one token of the uncased BERT
vocabulary). The same seed gives the same sentences on every machine and Python version.
"""

from __future__ import annotations

import random

# One cycle of word counts (the mask counts as a word): 32 sentences, mean 20.5 words.
WORD_COUNTS = (
    3,
    4,
    5,
    6,
    6,
    7,
    8,
    8,
    9,
    10,
    10,
    11,
    12,
    12,
    13,
    14,
    15,
    16,
    17,
    18,
    19,
    20,
    22,
    24,
    26,
    28,
    31,
    35,
    40,
    48,
    62,
    97,
)

# Common words, each a single token of bert-base-uncased's vocabulary (checked by the tests).
WORDS = (
    "the a one this that my our his her their some every no many few "
    "man woman child king queen friend teacher doctor farmer student family people team city "
    "country river house car road tree sky sun moon star water fire earth air book door room "
    "school church market village garden window table letter song story game music paper money "
    "day night week year morning evening winter summer time life world war peace law power "
    "is was has had will can could would should must may might "
    "go goes went see saw make made take took give gave find found tell told keep kept "
    "walk walks run runs read reads write writes sing sings eat eats sleep sleeps "
    "big small old new good bad red blue green long short high low young great little "
    "quick slow happy sad dark bright cold warm "
    "in on at to for with from by of over under near after before and but or because when"
).split()

MASK = "[MASK]"


def make_sentences(count: int, *, seed: int = 2024, mask: str = MASK) -> list[str]:
    """``count`` distinct sentences, each with exactly one ``mask``, in a fixed order."""
    rng = random.Random(seed)
    sentences: list[str] = []
    seen: set[str] = set()
    while len(sentences) < count:
        n_words = WORD_COUNTS[len(sentences) % len(WORD_COUNTS)]
        words = [rng.choice(WORDS) for _ in range(n_words)]
        words[rng.randrange(n_words)] = mask
        sentence = " ".join(words) + "."
        if sentence not in seen:  # a repeat could hide an answer sent to the wrong request
            seen.add(sentence)
            sentences.append(sentence)
    return sentences
