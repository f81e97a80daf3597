"""The costliest requests maskserve's limits admit, and a benchmark of what they do to a server.

:func:`costliest_body` builds the costliest of short texts: every text as long as the model reads,
as many texts as a request may hold, the most masks a text may hold, and the top_k that brings the
predictions to their limit, all in the Hugging Face Inference API's JSON. Each text is built of
one-letter words, one token each, so that its answer, whose every prediction repeats the whole
text, stays within the response limit (the tests check it is admitted).

Past the model's length the limits no longer bound the cost, the server's measured cost does: a
request that could not end within ``--request-timeout`` is refused before any work (422
``request_too_costly``). :func:`costliest_long_body` and :func:`costliest_score_body` build the
long families (fill-mask texts of ``--max-text-tokens`` with the most masks, and one text scored
token by token), and :func:`costliest_admitted` finds the largest of each that a running server
admits. The tests (tests/system/test_costliest_request.py and the fleet's) prove them harmless;
this module's ``main`` measures them:

    python -m benchmarks.costliest            # one server on the default model, defaults

It reports the costliest request's service time against a full batch of normal sentences, and
``/livez``'s latency while three costliest requests run, the service times of the costliest
admitted long-text and scoring requests, with the CPU flags it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from maskserve.config.settings import Settings
from maskserve.request.deadlines import TIMEOUT_HEADER
from maskserve.tasks.windows import Layout, windows

RESULTS = Path(__file__).resolve().parent / "results" / "costliest.md"
# The default model reads 512 tokens, two of them special ([CLS], [SEP]).
MODEL_TOKENS = 512
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# A prediction's JSON beside its sequence: the keys, the score, the token id and its string (the
# server bounds it with its vocabulary's longest piece).
PREDICTION_OVERHEAD_BYTES = 256
# The first deadline of an admission probe (:func:`admitted`): shorter than a costly request takes,
# so that the server answers on its cost alone, before any model work. It doubles while the door
# refuses it (on a slow model, even one text's predicted wait may be longer).
PROBE_TIMEOUT_S = 1.0


DEFAULTS = Settings()


def mask_positions(words: int, masks: int) -> list[int]:
    """Where ``masks`` masks go among ``words`` words: spread evenly, each in the middle of its share."""
    every = words // masks
    return [every * i + every // 2 for i in range(masks)]


def masked_text(words: int, masks: int, letter: str, mask: str = "[MASK]") -> str:
    """``words`` one-letter words (one token each) with ``masks`` of them masked (:func:`mask_positions`)."""
    masked = set(mask_positions(words, masks))
    return " ".join(mask if i in masked else letter for i in range(words))


def costliest_body(
    settings: Settings = DEFAULTS, model_tokens: int = MODEL_TOKENS, mask: str = "[MASK]"
) -> dict[str, Any]:
    """The Inference API body at every limit's maximum (see the module docstring)."""
    texts = settings.max_inputs
    masks = settings.masks_allowed(model_tokens, model_tokens)
    top_k = max(1, min(settings.max_top_k, settings.max_predictions // (texts * masks)))
    inputs = [masked_text(model_tokens - 2, masks, LETTERS[index % len(LETTERS)], mask) for index in range(texts)]
    return {"inputs": inputs, "parameters": {"top_k": top_k}}


def long_text_windows(settings: Settings = DEFAULTS, model_tokens: int = MODEL_TOKENS) -> int:
    """The windows one text of :func:`costliest_long_body` is read in: the server's own arithmetic,
    on a text whose every token is a word of its own."""
    words = settings.max_text_tokens - 2
    masks = settings.masks_allowed(settings.max_text_tokens, model_tokens)
    # Token positions count the leading special token ([CLS]).
    asked = [(1 + i, 1 + i) for i in mask_positions(words, masks)]
    word_ids = [None, *range(words), None]
    return len(windows(word_ids, asked, Layout(model_tokens, (1, 1))))


def long_texts_allowed(settings: Settings = DEFAULTS, model_tokens: int = MODEL_TOKENS) -> int:
    """The most texts of :func:`costliest_long_body` the limits admit, at top_k 1: the queue holds
    their windows, and their predictions (each repeating its whole text) fit the prediction and
    response limits."""
    masks = settings.masks_allowed(settings.max_text_tokens, model_tokens)
    return max(
        1,
        min(
            settings.max_inputs,
            settings.max_queue // long_text_windows(settings, model_tokens),
            settings.max_predictions // masks,
            settings.max_response_bytes // (masks * long_prediction_bytes(settings, model_tokens)),
        ),
    )


def long_prediction_bytes(settings: Settings = DEFAULTS, model_tokens: int = MODEL_TOKENS) -> int:
    """At most the bytes of one prediction of a :func:`costliest_long_body` text in the answer: the
    whole text again (two bytes a one-letter word, a space included, and a mask token's own
    seven), and the keys, score and token; above the server's own bound, which is what it checks."""
    masks = settings.masks_allowed(settings.max_text_tokens, model_tokens)
    return 2 * settings.max_text_tokens + 7 * masks + PREDICTION_OVERHEAD_BYTES


def costliest_long_body(
    settings: Settings = DEFAULTS, model_tokens: int = MODEL_TOKENS, texts: int | None = None
) -> dict[str, Any]:
    """The fill-mask body of long texts that costs the most: ``texts`` texts (by default as many
    as the limits admit, :func:`long_texts_allowed`) of ``--max-text-tokens`` tokens each, of
    one-letter words, with the most masks a text of that length may hold
    (:meth:`Settings.masks_allowed`) spread evenly, so that each window of the model's length
    holds a few. top_k is the largest that keeps the predictions and the answer, whose every
    prediction repeats its whole text, within their limits.

    The limits admit it; whether the server does depends on its measured cost
    (:func:`costliest_admitted` finds how many texts it admits).
    """
    texts = long_texts_allowed(settings, model_tokens) if texts is None else texts
    masks = settings.masks_allowed(settings.max_text_tokens, model_tokens)
    top_k = max(
        1,
        min(
            settings.max_top_k,
            settings.max_predictions // (texts * masks),
            settings.max_response_bytes // (texts * masks * long_prediction_bytes(settings, model_tokens)),
        ),
    )
    words = settings.max_text_tokens - 2
    inputs = [masked_text(words, masks, LETTERS[index % len(LETTERS)]) for index in range(texts)]
    return {"inputs": inputs, "parameters": {"top_k": top_k}}


def score_tokens_allowed(settings: Settings = DEFAULTS) -> int:
    """The most tokens one text of :func:`costliest_score_body` may score: ``--max-score-tokens``,
    in a text within ``--max-text-tokens`` (its special tokens included)."""
    return min(settings.max_score_tokens, settings.max_text_tokens - 2, settings.max_queue)


def costliest_score_body(settings: Settings = DEFAULTS, tokens: int | None = None) -> dict[str, Any]:
    """The ``POST /score`` body that costs the most: one text of ``tokens`` one-token words (by
    default as many as the limits admit, :func:`score_tokens_allowed`), every one scored.

    Each scored token is one masked copy of the text, of the window that holds it past the model's
    length, so the cost grows with the tokens times the model's length, and the server's measured
    cost, not the limits, bounds what it admits (:func:`costliest_admitted`). The two metrics cost
    the same (they mask different positions of as many copies of the same length);
    ``within_word_l2r`` it is, with every token's score in the answer.
    """
    tokens = score_tokens_allowed(settings) if tokens is None else tokens
    text = " ".join(LETTERS[i % len(LETTERS)] for i in range(tokens))
    return {"inputs": [text], "parameters": {"metric": "within_word_l2r", "tokens": True}}


async def admitted(session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float) -> bool | None:
    """Whether the idle server at ``url`` admits ``body`` on its measured cost, asked at no model
    work; None when its door refuses the short deadline itself.

    Sent with a deadline (``timeout_s``) shorter than a costly request takes, it is answered once
    its whole cost is known and before anything is queued: 422 ``request_too_costly`` when no
    deadline the server allows would do, 504 when only this short one is too short. A request
    cheap enough for the short deadline runs (200): admitted too. The door, before the body is
    read, refuses (503) a deadline shorter than the predicted wait of one text.
    """
    async with session.post(url, json=body, headers={TIMEOUT_HEADER: f"{timeout_s:g}"}) as response:
        data = await response.read()
        if response.status in (200, 504):
            return True
        kind = json.loads(data).get("error_type") if response.status in (422, 503) else None
        if kind == "request_too_costly":
            return False
        if kind == "overloaded":
            return None
        raise RuntimeError(f"{url} answered {response.status} to an admission probe: {data[:500]!r}")


async def largest_admitted(
    session: aiohttp.ClientSession,
    url: str,
    body_of: Callable[[int], dict[str, Any]],
    most: int,
    request_timeout: float = DEFAULTS.request_timeout,
) -> int:
    """The largest size in 1..``most`` whose body (``body_of(size)``) the idle server at ``url``
    admits, by bisection on its answers (a request's cost grows with its size); 0 when even 1 is
    refused. The probes' deadline starts at :data:`PROBE_TIMEOUT_S` and doubles while the door
    refuses it, up to the server's ``request_timeout``."""
    timeout_s = PROBE_TIMEOUT_S

    async def admits(size: int) -> bool:
        nonlocal timeout_s
        while (answer := await admitted(session, url, body_of(size), timeout_s)) is None:
            if timeout_s >= request_timeout:
                raise RuntimeError(f"{url} refuses even one text at its door: it is not idle")
            timeout_s = min(2 * timeout_s, request_timeout)
        return answer

    if await admits(most):
        return most
    low, high = 0, most  # the largest size known admitted (0: none yet), the smallest refused
    while high - low > 1:
        middle = (low + high) // 2
        if await admits(middle):
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class Family:
    """Requests of one shape that grow with one size: the path they go to, the body at a size,
    and the largest size the limits admit."""

    path: str
    body_of: Callable[[int], dict[str, Any]]
    most: int


def family_of(name: str, settings: Settings = DEFAULTS, model_tokens: int = MODEL_TOKENS) -> Family:
    """``"long"``: :func:`costliest_long_body` by its texts; ``"score"``: :func:`costliest_score_body`
    by its scored tokens."""
    if name == "long":
        return Family(
            "/",
            lambda texts: costliest_long_body(settings, model_tokens, texts),
            long_texts_allowed(settings, model_tokens),
        )
    if name == "score":
        return Family("/score", lambda tokens: costliest_score_body(settings, tokens), score_tokens_allowed(settings))
    raise ValueError(f"no family {name!r}: long or score")


@dataclass(frozen=True)
class Admitted:
    """The costliest request of one family that a server admits, and its size: texts for
    fill-mask, scored tokens for ``/score`` (0 and no body when it admits none)."""

    size: int
    body: dict[str, Any] | None


async def costliest_admitted(
    session: aiohttp.ClientSession,
    base_url: str,
    name: str,
    settings: Settings = DEFAULTS,
    model_tokens: int = MODEL_TOKENS,
) -> Admitted:
    """The costliest request of the family ``name`` (:func:`family_of`) that the idle server at
    ``base_url``, run with ``settings``, admits: one it predicts to end within its request timeout,
    found on its own answers (:func:`admitted`) at the cost of no forward pass but a short one for
    a small size."""
    family = family_of(name, settings, model_tokens)
    size = await largest_admitted(
        session, base_url + family.path, family.body_of, family.most, settings.request_timeout
    )
    return Admitted(size, family.body_of(size) if size else None)


@dataclass(frozen=True)
class Sent:
    """The costliest request of a family that a server took in, and its answer."""

    admitted: Admitted
    status: int
    body: bytes
    seconds: float
    headers: dict[str, str]


# How many sizes down :func:`send_costliest` goes, each a twentieth smaller (one less at least),
# while the request is refused before any work for the time its parsing took.
STEP_DOWNS = 4


async def send_costliest(
    session: aiohttp.ClientSession,
    base_url: str,
    name: str,
    found: Admitted,
    settings: Settings = DEFAULTS,
    model_tokens: int = MODEL_TOKENS,
) -> Sent:
    """The costliest request of the family ``name`` that the idle server at ``base_url`` takes in,
    sent with the server's own deadline, and its answer.

    ``found`` (:func:`costliest_admitted`) is the largest the server predicts to end within its
    request timeout. Sent with that whole deadline, parsing takes a little of it, so a request at
    the very edge is refused at once (504: it would take more than the time left); then the next
    size down is sent, a few times at most. A 504 later than half the timeout is the deadline's own.
    """
    family = family_of(name, settings, model_tokens)
    if found.body is None:
        return Sent(found, 0, b"", 0.0, {})
    for _ in range(STEP_DOWNS):
        started = time.perf_counter()
        async with session.post(base_url + family.path, json=found.body) as response:
            data = await response.read()
        sent = Sent(found, response.status, data, time.perf_counter() - started, dict(response.headers))
        if sent.status != 504 or sent.seconds > settings.request_timeout / 2 or found.size == 1:
            break
        size = found.size - max(1, found.size // 20)
        found = Admitted(size, family.body_of(size))
    return sent


def normal_sentences(count: int) -> list[str]:
    from benchmarks.sentences import make_sentences

    return make_sentences(count)


@dataclass
class Prober:
    """Polls a path on its own thread and connection, so the test's or benchmark's own event loop
    (which reads megabytes of answers) never delays a probe's clock."""

    url: str
    path: str = "/livez"
    interval_s: float = 0.02
    latencies_s: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Prober:
        self._thread = threading.Thread(target=self._run, name=f"probe{self.path}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        parts = urlsplit(self.url)
        connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                connection.request("GET", self.path)
                response = connection.getresponse()
                response.read()
                self.statuses.append(response.status)
            except (OSError, http.client.HTTPException):
                self.statuses.append(0)
                connection.close()
            self.latencies_s.append(time.perf_counter() - started)
            self._stop.wait(self.interval_s)
        connection.close()

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def post_json(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, bytes, float]:
    """(status, body, seconds) of one POST; the body is read, not parsed."""
    started = time.perf_counter()
    async with session.post(url, json=body) as response:
        data = await response.read()
        return response.status, data, time.perf_counter() - started


def cpu_flags() -> str:
    wanted = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx_vnni", "avx2")
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    return f"{model or platform.processor()}; " + (
        " ".join(f for f in wanted if f in flags) or "none of " + ", ".join(wanted)
    )


async def measure(url: str, rounds: int) -> dict[str, Any]:
    """Service time of one costliest request and of one full batch of normal sentences, alone,
    alternated ``rounds`` times; then /livez while three costliest requests run at once; then the
    service times of the costliest long-text and scoring requests the server admits."""
    costly = costliest_body()
    normal = {"inputs": normal_sentences(DEFAULTS.max_batch_size)}
    costly_s: list[float] = []
    normal_s: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for _ in range(rounds):
            status, _, seconds = await post_json(session, url + "/", normal)
            assert status == 200, status
            normal_s.append(seconds)
            status, body, seconds = await post_json(session, url + "/", costly)
            assert status == 200, (status, body[:300])
            costly_s.append(seconds)
            size = len(body)
        prober = Prober(url).start()
        try:
            results = await asyncio.gather(*(post_json(session, url + "/", costly) for _ in range(3)))
        finally:
            prober.stop()
        long = await send_costliest(session, url, "long", await costliest_admitted(session, url, "long"))
        long_s, long_bytes = await service_times(session, url + "/", long, rounds)
        score = await send_costliest(session, url, "score", await costliest_admitted(session, url, "score"))
        score_s, score_bytes = await service_times(session, url + "/score", score, rounds)
        ratios = await advertised_against_real(session, url)
    return {
        "long_texts": long.admitted.size,
        "long_top_k": long.admitted.body["parameters"]["top_k"] if long.admitted.body else 0,
        "long_s": statistics.median(long_s) if long_s else 0.0,
        "long_bytes": long_bytes,
        "score_tokens": score.admitted.size,
        "score_s": statistics.median(score_s) if score_s else 0.0,
        "score_ratio": statistics.median(score_s) / statistics.median(normal_s) if score_s else 0.0,
        "score_bytes": score_bytes,
        "wait_ratio_p10": ratios[len(ratios) // 10],
        "wait_ratio_p50": ratios[len(ratios) // 2],
        "wait_ratio_p90": ratios[len(ratios) * 9 // 10],
        "wait_probes": len(ratios),
        "costly_s": statistics.median(costly_s),
        "normal_s": statistics.median(normal_s),
        "ratio": statistics.median(costly_s) / statistics.median(normal_s),
        "answer_bytes": size,
        "three_statuses": [r[0] for r in results],
        "three_s": max(r[2] for r in results),
        "livez_p50_ms": prober.percentile(0.5) * 1000,
        "livez_p99_ms": prober.percentile(0.99) * 1000,
        "livez_max_ms": max(prober.latencies_s) * 1000,
        "livez_probes": len(prober.latencies_s),
        "livez_failures": sum(1 for s in prober.statuses if s != 200),
    }


async def service_times(session: aiohttp.ClientSession, url: str, sent: Sent, rounds: int) -> tuple[list[float], int]:
    """Service times of the request ``sent``, that one and ``rounds`` - 1 more alone, and its
    answer's size (none when the server admitted none of its family)."""
    if sent.admitted.body is None:
        return [], 0
    assert sent.status == 200, (sent.status, sent.body[:300])
    seconds_each = [sent.seconds]
    for _ in range(rounds - 1):
        status, answer, seconds = await post_json(session, url, sent.admitted.body)
        assert status == 200, (status, answer[:300])
        seconds_each.append(seconds)
    return seconds_each, len(sent.body)


async def advertised_against_real(session: aiohttp.ClientSession, url: str, seconds: float = 15.0) -> list[float]:
    """On a flood of long and short texts, the real wait of one more text over the wait advertised
    just before (``/readyz``'s ``predicted_wait_s``, what the door and Retry-After go by); sorted."""
    long_text = {"inputs": [" ".join(["word"] * 400 + ["[MASK]"])], "parameters": {"top_k": 20}}
    short = normal_sentences(64)
    stop = asyncio.Event()

    async def flood(index: int) -> None:
        while not stop.is_set():
            body = long_text if index % 4 == 0 else {"inputs": short[index % len(short)]}
            status, _, _ = await post_json(session, url + "/", body)
            if status == 503:
                await asyncio.sleep(0.05)

    flooders = [asyncio.create_task(flood(i)) for i in range(48)]
    ratios: list[float] = []
    try:
        await asyncio.sleep(1.0)
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            async with session.get(url + "/readyz") as response:
                predicted = (await response.json())["predicted_wait_s"]
            status, _, real = await post_json(session, url + "/", {"inputs": short[0]})
            if status == 200 and predicted > 0:
                ratios.append(real / predicted)
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.gather(*flooders)
    return sorted(ratios)


def report(figures: dict[str, Any], command: str) -> str:
    body = costliest_body()
    texts = len(body["inputs"])
    long_masks = DEFAULTS.masks_allowed(DEFAULTS.max_text_tokens, MODEL_TOKENS)
    return "\n".join(
        [
            "# The costliest admitted request",
            "",
            f"`{command}` on {time.strftime('%Y-%m-%d')}; CPU: {cpu_flags()}.",
            "",
            f"The request: {texts} texts of {MODEL_TOKENS} tokens, {DEFAULTS.max_masks_per_text} masks each, "
            f"top_k {body['parameters']['top_k']} (every default limit at its maximum), on the default model.",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| service time, alone (median) | {figures['costly_s']:.2f} s |",
            f"| a full batch of {DEFAULTS.max_batch_size} normal sentences, alone (median) | "
            f"{figures['normal_s'] * 1000:.0f} ms |",
            f"| ratio | {figures['ratio']:.0f}x |",
            f"| its answer | {figures['answer_bytes'] / 1e6:.2f} MB |",
            f"| three at once: statuses, slowest | {figures['three_statuses']}, {figures['three_s']:.2f} s |",
            f"| `/livez` meanwhile: p50 / p99 / max ({figures['livez_probes']} probes, "
            f"{figures['livez_failures']} failed) | "
            f"{figures['livez_p50_ms']:.1f} / {figures['livez_p99_ms']:.1f} / {figures['livez_max_ms']:.1f} ms |",
            "",
            "Past the model's length the limits no longer bound a request's cost, the measured cost does: "
            "the server refuses, before any work, a request that could not end within `--request-timeout` "
            f"({DEFAULTS.request_timeout:g} s; 422 `request_too_costly`). The costliest it took in, found by "
            "bisection on its own answers to requests sent with a 1 s deadline (answered before any model "
            "work), a size down while parsing left too little of the deadline:",
            "",
            f"- long texts: {figures['long_texts']} of {DEFAULTS.max_text_tokens} tokens (`--max-text-tokens`), "
            f"{long_masks} masks each (`--max-masks-per-text` for every model length), "
            f"{long_text_windows()} windows each, top_k {figures['long_top_k']};",
            f"- scoring (`POST /score`): 1 text of {figures['score_tokens']} scored tokens, metric "
            "`within_word_l2r` with every token's score: as many masked copies, each of the window that holds "
            "its token past the model's length.",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| long texts: service time, alone (median) | {figures['long_s']:.2f} s |",
            f"| long texts: its answer | {figures['long_bytes'] / 1e6:.2f} MB |",
            f"| scoring: service time, alone (median) | {figures['score_s']:.2f} s |",
            f"| ratio to the full batch of normal sentences | {figures['score_ratio']:.0f}x |",
            f"| scoring: its answer | {figures['score_bytes'] / 1e3:.0f} kB |",
            "",
            "The advertised wait against the real one, on a flood of long and short texts (48 clients): the",
            "real wait of one more short text over `/readyz`'s `predicted_wait_s` just before it (what the",
            "door and Retry-After go by).",
            "",
            "| probes | p10 | median | p90 |",
            "| --- | --- | --- | --- |",
            f"| {figures['wait_probes']} | {figures['wait_ratio_p10']:.2f} | {figures['wait_ratio_p50']:.2f} | "
            f"{figures['wait_ratio_p90']:.2f} |",
            "",
        ]
    )


def main() -> None:
    from benchmarks.run import publish
    from benchmarks.servers import Server, free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    argv = [sys.executable, "-m", "maskserve", "--port", str(port), "--log-level", "warning"]
    server = Server("maskserve", argv, port, RESULTS.parents[2] / "artifacts" / "costliest.log")
    server.start()
    try:
        figures = asyncio.run(measure(f"http://127.0.0.1:{port}", args.rounds))
    finally:
        server.stop()
    publish(report(figures, "python -m benchmarks.costliest"), RESULTS)


if __name__ == "__main__":
    main()
