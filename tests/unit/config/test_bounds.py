"""How the limits fit each other (config/bounds.py): defaults that follow a limit the user sets,
and the pairs of values start-up refuses, naming both."""

from __future__ import annotations

import click
import pytest

from maskserve.config.bounds import BOUNDS, contradictions, followed
from maskserve.config.flags import build_command, load_settings
from maskserve.config.settings import Settings, SettingsError

# Both values written by the user: refused, naming both (and where each came from).
CONTRADICTIONS = [
    (["--max-inputs", "300", "--max-queue", "256"], {}, ("--max-inputs=300", "--max-queue=256")),
    (["--max-queue", "512", "--max-score-tokens", "1024"], {}, ("--max-score-tokens=1024", "--max-queue=512")),
    (["--max-queue", "10"], {"MASKSERVE_MAX_INPUTS": "64"}, ("MASKSERVE_MAX_INPUTS=64", "--max-queue=10")),
    (["--max-queue", "8", "--max-score-tokens", "64"], {}, ("--max-score-tokens=64", "--max-queue=8")),
    ([], {"MASKSERVE_MAX_QUEUE": "8", "MASKSERVE_MAX_WORD_COPIES": "64"}, ("WORD_COPIES=64", "QUEUE=8")),
    (["--default-top-k", "50", "--max-top-k", "10"], {}, ("--default-top-k=50", "--max-top-k=10")),
    (["--default-top-k", "8", "--max-predictions", "4"], {}, ("--default-top-k=8", "--max-predictions=4")),
    (["--max-response-bytes", "2000", "--max-unsent-bytes", "1000"], {}, ("--max-unsent-bytes=1000", "bytes=2000")),
    ([], {"MASKSERVE_MAX_BATCH_DELAY": "45"}, ("MASKSERVE_MAX_BATCH_DELAY=45.0", "--request-timeout=")),
    (["--grpc-port", "8000"], {}, ("--port=8000 (the default)", "--grpc-port=8000")),
    (["--grpc-port", "9101"], {"MASKSERVE_AGENT_PORT": "9101"}, ("--grpc-port=9101", "MASKSERVE_AGENT_PORT=9101")),
]


# One limit written, by flag or by variable: each default bounded by it moves to fit, and nothing else.
FOLLOWED = [
    (
        ["--max-queue", "8"],
        {},
        {"max_inputs": 8, "max_score_tokens": 8, "max_word_copies": 8},
        {"max_inputs": "max_queue", "max_score_tokens": "max_queue", "max_word_copies": "max_queue"},
    ),
    (
        [],
        {"MASKSERVE_MAX_QUEUE": "100"},
        {"max_inputs": 64, "max_score_tokens": 100, "max_word_copies": 64},
        {"max_score_tokens": "max_queue"},
    ),
    (["--max-inputs", "5000"], {}, {"max_queue": 5000}, {"max_queue": "max_inputs"}),
    ([], {"MASKSERVE_MAX_SCORE_TOKENS": "5000"}, {"max_queue": 5000}, {"max_queue": "max_score_tokens"}),
    (["--max-word-copies", "5000"], {}, {"max_queue": 5000}, {"max_queue": "max_word_copies"}),
    (["--max-top-k", "3"], {}, {"default_top_k": 3}, {"default_top_k": "max_top_k"}),
    ([], {"MASKSERVE_MAX_PREDICTIONS": "2"}, {"default_top_k": 2}, {"default_top_k": "max_predictions"}),
    (
        ["--default-top-k", "3000"],
        {},
        {"max_top_k": 3000, "max_predictions": 3000},
        {"max_top_k": "default_top_k", "max_predictions": "default_top_k"},
    ),
    (
        [],
        {"MASKSERVE_MAX_UNSENT_BYTES": "1000"},
        {"max_response_bytes": 1000},
        {"max_response_bytes": "max_unsent_bytes"},
    ),
    (
        ["--max-response-bytes", str(64 * 1_048_576)],
        {},
        {"max_unsent_bytes": 64 * 1_048_576},
        {"max_unsent_bytes": "max_response_bytes"},
    ),
    # A written value inside the other's default moves nothing.
    (["--max-queue", "5000"], {}, {"max_inputs": 64, "max_score_tokens": 4096}, {}),
    # The limits that follow the longest text: the score limit and the characters move with it, and
    # the queue rises to hold the copies of one text scored whole.
    (
        ["--max-text-tokens", "8192"],
        {},
        {"max_score_tokens": 8192, "max_text_chars": 65536, "max_queue": 8192},
        {"max_score_tokens": "max_text_tokens", "max_text_chars": "max_text_tokens", "max_queue": "max_score_tokens"},
    ),
    (
        [],
        {"MASKSERVE_MAX_TEXT_TOKENS": "1000"},
        {"max_score_tokens": 1000, "max_text_chars": 8000, "max_queue": 4096},
        {"max_score_tokens": "max_text_tokens", "max_text_chars": "max_text_tokens"},
    ),
    # A written queue still bounds what follows the text.
    (
        ["--max-text-tokens", "8192", "--max-queue", "2048"],
        {},
        {"max_score_tokens": 2048, "max_queue": 2048},
        {"max_score_tokens": "max_queue", "max_text_chars": "max_text_tokens"},
    ),
    # A written follower holds.
    (
        ["--max-text-tokens", "8192", "--max-score-tokens", "256"],
        {},
        {"max_score_tokens": 256, "max_queue": 4096},
        {"max_text_chars": "max_text_tokens"},
    ),
]


@pytest.mark.parametrize(("argv", "environ", "named"), CONTRADICTIONS)
def test_settings_that_contradict_each_other_are_refused_naming_both(
    argv: list[str], environ: dict[str, str], named: tuple[str, str]
) -> None:
    with pytest.raises(SettingsError, match="contradicts") as caught:
        load_settings(argv, env=environ)
    for name in named:
        assert name in str(caught.value)


@pytest.mark.parametrize(("argv", "environ", "expected", "follows"), FOLLOWED)
def test_a_default_that_would_contradict_a_written_limit_follows_it(
    argv: list[str], environ: dict[str, str], expected: dict[str, int], follows: dict[str, str]
) -> None:
    settings = load_settings(argv, env=environ)
    assert {name: getattr(settings, name) for name in expected} == expected
    assert followed(settings) == follows
    assert not list(contradictions(settings))


def test_every_pair_that_can_contradict_is_one_that_follows_or_is_named() -> None:
    """Each bound is covered above both ways: refused when both are written, followed when one is."""
    refused = {(b.lower, b.upper) for b in BOUNDS}
    assert len(refused) == len(BOUNDS) == 6
    moved = {(name, other) for _, _, _, follows in FOLLOWED for name, other in follows.items()}
    for bound in BOUNDS:
        assert (bound.lower, bound.upper) in moved and (bound.upper, bound.lower) in moved, bound


def test_the_defaults_agree_with_each_other_and_follow_nothing() -> None:
    settings = load_settings([], env={})
    assert settings == Settings() and followed(settings) == {} and not list(contradictions(settings))
    assert settings.given == frozenset()


def test_help_says_which_defaults_follow_which_limits() -> None:
    helps = {option.name: option.help or "" for option in build_command().params if isinstance(option, click.Option)}
    assert helps["max_score_tokens"].endswith(
        "default 4096, following --max-text-tokens, or the smallest of --max-queue you set, if smaller]"
    )
    assert helps["max_text_chars"].endswith("default 32768, following 8 x --max-text-tokens]")
    assert helps["max_masks_per_text"].endswith("default 8, for each model length of a text unless set]")
    assert (
        "or the largest of --max-inputs, --max-score-tokens, --max-word-copies you set, if larger]"
        in helps["max_queue"]
    )
    assert helps["port"].endswith("; default 8000]")


def test_limits_that_agree_at_their_edges_are_accepted() -> None:
    settings = load_settings(["--max-inputs", "256", "--default-top-k", "100", "--max-batch-delay", "29.9"], env={})
    assert (settings.max_inputs, settings.default_top_k) == (256, 100)


def test_the_score_limit_lets_the_longest_text_through_by_default() -> None:
    settings = Settings()
    assert settings.max_score_tokens == settings.max_text_tokens <= settings.max_queue
