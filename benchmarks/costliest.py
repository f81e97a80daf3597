"""The costliest request maskserve's limits admit, and a benchmark of what it does to a server.

:func:`costliest_body` builds it: every text as long as the model reads, as many texts as a request
may hold, the most masks a text may hold, and the top_k that brings the predictions to their
limit, all in the Hugging Face Inference API's JSON. Each text is built of one-letter words, one
token each, so that its answer, whose every prediction repeats the whole text, stays within the
response limit (the tests check it is admitted). The tests (tests/system/test_costliest_request.py and
the fleet's) prove it harmless; this module's ``main`` measures it:

    python -m benchmarks.costliest            # one server on the default model, defaults

It reports the costliest request's service time against a full batch of normal sentences, and
``/livez``'s latency while three costliest requests run, the same service time for the costliest
scoring request (:func:`costliest_score_body`), with the CPU flags it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from maskserve.config.settings import Settings

RESULTS = Path(__file__).resolve().parent / "results" / "costliest.md"
# The default model reads 512 tokens, two of them special ([CLS], [SEP]).
MODEL_TOKENS = 512
LETTERS = "abcdefghijklmnopqrstuvwxyz"


DEFAULTS = Settings()


def costliest_body(
    settings: Settings = DEFAULTS, model_tokens: int = MODEL_TOKENS, mask: str = "[MASK]"
) -> dict[str, Any]:
    """The Inference API body at every limit's maximum (see the module docstring)."""
    texts = settings.max_inputs
    masks = settings.max_masks_per_text
    top_k = max(1, min(settings.max_top_k, settings.max_predictions // (texts * masks)))
    words = model_tokens - 2
    every = words // masks
    inputs = []
    for index in range(texts):
        letter = LETTERS[index % len(LETTERS)]
        tokens = [mask if i % every == every // 2 and i // every < masks else letter for i in range(words)]
        inputs.append(" ".join(tokens))
    return {"inputs": inputs, "parameters": {"top_k": top_k}}


def costliest_score_body(settings: Settings = DEFAULTS) -> dict[str, Any]:
    """The ``POST /score`` body the limits admit that costs the most: the most masked copies one
    request may queue (``--max-queue``), each as long as a copy may be.

    Every token of a text but the special ones is scored, one copy each, so a copy is at most
    ``--max-score-tokens`` + 2 tokens long, and a request holds at most ``--max-queue`` copies in
    all: as few texts as carry that many, each of ``--max-score-tokens`` one-token words. The two
    metrics cost the same (they mask different positions of as many copies of the same length);
    ``within_word_l2r`` it is, with every token's score in the answer.
    """
    per_text = settings.max_score_tokens
    texts = max(1, min(settings.max_inputs, settings.max_queue // per_text))
    inputs = [" ".join(LETTERS[(index + i) % len(LETTERS)] for i in range(per_text)) for index in range(texts)]
    return {"inputs": inputs, "parameters": {"metric": "within_word_l2r", "tokens": True}}


def costliest_long_body(settings: Settings = DEFAULTS, model_tokens: int = MODEL_TOKENS) -> dict[str, Any]:
    """The fill-mask body of long texts the limits admit that costs the most: the most windows one
    request may queue (``--max-queue``), each as long as the model reads.

    Every text is ``--max-text-tokens`` long, of one-letter words (one token each), with the most
    masks a text may hold, spread so far apart that each takes a window of its own; as many texts
    as bring the windows to the queue's size. top_k is the largest that keeps the answer, whose
    every prediction repeats its whole text, within ``--max-response-bytes``.
    """
    words = settings.max_text_tokens - 2
    masks = settings.max_masks_per_text
    texts = max(1, min(settings.max_inputs, settings.max_queue // masks))
    every = words // masks
    # Masks share a window when within half of one of each other: these never do.
    assert every > model_tokens // 2, "texts too short for a window a mask"
    # A prediction's JSON: the whole text again (a letter and a space a token), and its keys.
    prediction_bytes = 2 * words + 200
    top_k = max(
        1,
        min(
            settings.max_top_k,
            settings.max_predictions // (texts * masks),
            settings.max_response_bytes // (texts * masks * prediction_bytes),
        ),
    )
    inputs = []
    for index in range(texts):
        letter = LETTERS[index % len(LETTERS)]
        tokens = ["[MASK]" if i % every == every // 2 and i // every < masks else letter for i in range(words)]
        inputs.append(" ".join(tokens))
    return {"inputs": inputs, "parameters": {"top_k": top_k}}


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
    alternated ``rounds`` times; then /livez while three costliest requests run at once."""
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
        score_s, score_bytes = await score_service_times(session, url, rounds)
        ratios = await advertised_against_real(session, url)
    return {
        "score_s": statistics.median(score_s),
        "score_ratio": statistics.median(score_s) / statistics.median(normal_s),
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


async def score_service_times(session: aiohttp.ClientSession, url: str, rounds: int) -> tuple[list[float], int]:
    """Service times of the costliest scoring request alone, ``rounds`` times, and its answer's size."""
    costly = costliest_score_body()
    seconds_each: list[float] = []
    size = 0
    for _ in range(rounds):
        status, body, seconds = await post_json(session, url + "/score", costly)
        assert status == 200, (status, body[:300])
        seconds_each.append(seconds)
        size = len(body)
    return seconds_each, size


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
    score_body = costliest_score_body()
    texts = len(body["inputs"])
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
            "The costliest admitted scoring request (`POST /score`): "
            f"{len(score_body['inputs'])} text{'s' if len(score_body['inputs']) != 1 else ''} of "
            f"{DEFAULTS.max_score_tokens} scored tokens "
            f"(`--max-score-tokens`), metric `{score_body['parameters']['metric']}` with every token's score: "
            f"{DEFAULTS.max_queue} masked copies of {DEFAULTS.max_score_tokens + 2} tokens, the whole queue "
            "(`--max-queue`), so none other is admitted beside it.",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| service time, alone (median) | {figures['score_s']:.2f} s |",
            f"| ratio to the full batch of normal sentences | {figures['score_ratio']:.0f}x |",
            f"| its answer | {figures['score_bytes'] / 1e3:.0f} kB |",
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
