"""The benchmark's pieces work, on the default model and tiny counts (no timing is asserted)."""

from __future__ import annotations

import ast
import asyncio
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoTokenizer

from benchmarks import offline
from benchmarks.fleet import DIRECT, ONE, THREE, Measurement, Round, Rounds, parse_args, render
from benchmarks.load import LoadResult, check_answer, is_loopback, percentile, run_load
from benchmarks.models import BenchModel, default_model
from benchmarks.sentences import MASK, WORD_COUNTS, WORDS, make_sentences
from maskserve.engine import FillMaskEngine, default_model_dir
from tests.conftest import HAS_ONNXRUNTIME, HAS_OPENVINO, ClientFactory


@pytest.fixture(scope="module")
def default_pipe() -> Any:
    return offline.load_pipeline(str(default_model_dir()))


@pytest.fixture(scope="module")
def mix(default_pipe: Any) -> tuple[list[str], list[Any]]:
    sentences = make_sentences(8)
    expected, _ = offline.reference_answers(default_pipe, sentences)
    return sentences, expected


def test_sentence_mix_is_fixed_distinct_one_mask_each_and_23_5_tokens_on_average() -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    sentences = make_sentences(len(WORD_COUNTS))
    assert sentences == make_sentences(len(WORD_COUNTS))
    assert len(set(sentences)) == len(sentences)
    assert all(s.count(MASK) == 1 for s in sentences)
    assert [w for w in WORDS if len(tokenizer(w, add_special_tokens=False)["input_ids"]) != 1] == []
    lengths = [len(ids) for ids in tokenizer(sentences)["input_ids"]]
    assert sum(lengths) / len(lengths) == 23.5
    assert (min(lengths), max(lengths)) == (6, 100)


def test_check_answer_accepts_its_own_answer_and_catches_a_swapped_one(
    default_pipe: Any, mix: tuple[list[str], list[Any]]
) -> None:
    sentences, expected = mix
    first, second = default_pipe(sentences[0]), default_pipe(sentences[1])
    assert check_answer(first, expected[0]) is None
    assert check_answer(second, expected[1]) is None
    assert check_answer(second, expected[0]) is not None
    assert check_answer(first, expected[1]) is not None
    assert check_answer({"error": "boom"}, expected[0]) is not None


def test_check_answer_catches_a_right_token_with_another_sentences_sequence(mix: tuple[list[str], list[Any]]) -> None:
    _, expected = mix
    token, sequence = next(iter(expected[0].items()))
    assert check_answer([{"token": token, "sequence": sequence, "score": 0.5}], expected[0]) is None
    other = next(iter(expected[1].values()))
    assert "another sentence" in str(check_answer([{"token": token, "sequence": other, "score": 0.5}], expected[0]))


async def test_load_counts_correct_answers_and_flags_answers_checked_against_the_wrong_sentence(
    make_client: ClientFactory, default_engine: FillMaskEngine, mix: tuple[list[str], list[Any]]
) -> None:
    sentences, expected = mix
    client = await make_client(engine=default_engine)
    url = str(client.make_url("/"))
    good = await run_load(url, sentences, expected, concurrency=4, requests=12, time_cap_s=60)
    assert (good.sent, good.correct, good.wrong, good.statuses) == (12, 12, 0, Counter({"200": 12}))
    assert len(good.latencies_ms) == 12 and good.rps > 0
    swapped = expected[1:] + expected[:1]  # every answer now checked against its neighbour
    bad = await run_load(url, sentences, swapped, concurrency=4, requests=8, time_cap_s=60)
    assert (bad.correct, bad.wrong, bad.rps) == (0, 8, 0.0)
    assert bad.first_wrong is not None


async def test_load_goes_to_loopback_only(mix: tuple[list[str], list[Any]]) -> None:
    sentences, expected = mix
    with pytest.raises(ValueError, match="loopback"):
        await run_load("http://192.0.2.1:8000/", sentences, expected, concurrency=1, requests=1, time_cap_s=1)


def test_every_loopback_address_counts_as_loopback() -> None:
    # A fleet on one machine gives each replica its own address in 127.0.0.0/8.
    assert all(is_loopback(host) for host in ("127.0.0.1", "127.0.0.11", "localhost", "::1"))
    assert not any(is_loopback(host) for host in ("192.0.2.1", "10.0.0.1", "example.com", "", None))


async def test_load_stops_when_told_and_describes_each_failure(
    make_client: ClientFactory, default_engine: FillMaskEngine, mix: tuple[list[str], list[Any]]
) -> None:
    sentences, expected = mix
    client = await make_client(engine=default_engine)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.5, stop.set)
    swapped = expected[1:] + expected[:1]
    result = await run_load(
        str(client.make_url("/")), sentences, swapped, concurrency=2, requests=10**6, time_cap_s=60, stop=stop
    )
    assert result.stopped and not result.capped and 0 < result.sent < 10**6
    assert result.failed == result.wrong == result.sent
    assert 0 < len(result.failures) <= 20 and "wrong answer to sentence" in result.failures[0]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (50.0, 90.0, 99.0)
    assert percentile([3.0], 99) == 3.0


def test_length_sorting_keeps_every_sentence_and_orders_by_tokens(default_pipe: Any) -> None:
    sentences = make_sentences(32)
    ordered = offline.by_length(default_pipe, sentences)
    lengths = [len(ids) for ids in default_pipe.tokenizer(ordered)["input_ids"]]
    assert sorted(ordered) == sorted(sentences)
    assert lengths == sorted(lengths)
    assert offline.offline_rate(default_pipe, ordered[:8], batch_size=4) > 0


@pytest.mark.slow
@pytest.mark.load
def test_one_run_measures_seed_maskserve_and_offline_and_renders_the_table(tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="the seed design needs the bench extra: pip install starlette uvicorn")
    pytest.importorskip("uvicorn", reason="the seed design needs the bench extra: pip install starlette uvicorn")
    from benchmarks.interleaved import OFFLINE
    from benchmarks.run import (
        BACKEND_SYSTEMS,
        EXTRA_CONCURRENCY,
        MASKSERVE,
        MASKSERVE_ORT,
        SEED,
        TRACED,
        TRACED_UNEXPORTED,
        WORKERS,
        Plan,
        render,
        run_model,
    )

    plan = Plan(mix=8, requests={4: 8, EXTRA_CONCURRENCY: 64}, batch_sizes=(1, 4), rounds=2, time_cap_s=60)
    model = default_model()
    backends = ("torch", *(["onnxruntime"] if HAS_ONNXRUNTIME else []), *(["openvino"] if HAS_OPENVINO else []))
    systems = [BACKEND_SYSTEMS[b] for b in backends]
    concurrencies = [4, EXTRA_CONCURRENCY]
    run = run_model(
        BenchModel("tiny", model.path), plan, concurrencies, log_dir=tmp_path, backends=backends, extras=True
    )
    assert len(run.rounds) == 2 and run.systems == tuple(systems) and run.extras == (TRACED, TRACED_UNEXPORTED, WORKERS)
    for round_ in run.rounds:
        for system in (SEED, *systems):
            assert round_.loads[system, 4].correct == 8
        for system in (TRACED, TRACED_UNEXPORTED, WORKERS):
            assert round_.loads[system, EXTRA_CONCURRENCY].correct == 64
        assert set(round_.offline) == {(False, 1), (True, 1), (False, 4), (True, 4)}
        assert len(round_.single_call_ms) == 8
        # Concurrency 1, interleaved: every sentence to every server and to the offline call.
        assert round_.interleaved is not None
        assert set(round_.interleaved.latencies_ms) == {SEED, *systems, OFFLINE}
        assert all(len(ms) == 8 for ms in round_.interleaved.latencies_ms.values())
        assert not round_.interleaved.wrong and not round_.interleaved.failed
    assert set(run.rss) == set(systems) and all(run.rss_after_warmup[s] > 0 for s in systems)
    # One scrape of the 2-worker server counts every request it answered, labelled by worker.
    assert set(run.worker_requests) == {"0", "1"}
    assert sum(run.worker_requests.values()) >= 2 * 64 + 8  # the rounds and the warm-up
    table = render([run], concurrencies, "python -m benchmarks.run --test", "test")
    assert "| 4 | maskserve | " in table and "| 4 | seed design | " in table and "200: 16 | 0 |" in table
    assert f"| {EXTRA_CONCURRENCY} | {TRACED} | " in table and f"| {EXTRA_CONCURRENCY} | {WORKERS} | " in table
    assert "offline pipeline, length-sorted" in table and "Concurrency 1, interleaved" in table
    assert f"| {MASKSERVE} | " in table and f"| {OFFLINE} | " in table
    assert "Tracing (every span batched" in table and "Tracing (spans created" in table
    assert "--workers 2 at c=64" in table and 'worker="1"' in table
    assert run.otlp_exports[0] > 0  # the traced server really exported to the sink
    if HAS_ONNXRUNTIME:
        assert f"| 4 | {MASKSERVE_ORT} | " in table and f"/ {MASKSERVE} (torch) |" in table
        assert f"{MASKSERVE_ORT} p50 / {MASKSERVE} (torch) p50 =" in table
    if HAS_ONNXRUNTIME and HAS_OPENVINO:
        assert "maskserve openvino / maskserve onnxruntime: req/s at c=64" in table


def test_matrix_units_section_holds_bf16_to_the_amx_targets_only_on_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import run as bench
    from benchmarks.interleaved import Interleaved

    def load(rps: float) -> LoadResult:
        return LoadResult(64, sent=int(rps), correct=int(rps), duration_s=1.0)

    rates = {bench.MASKSERVE: 10, bench.MASKSERVE_ORT: 12, bench.MASKSERVE_OV: 15, bench.MASKSERVE_OV_BF16: 30}
    round_ = bench.Round(
        loads={(system, 64): load(rps) for system, rps in rates.items()},
        offline={(True, 8): 20.0},
        interleaved=Interleaved(
            {
                bench.MASKSERVE: [40.0],
                bench.MASKSERVE_ORT: [30.0],
                bench.MASKSERVE_OV: [24.0],
                bench.MASKSERVE_OV_BF16: [12.0],
            }
        ),
    )
    run = bench.ModelRun(default_model(), bench.QUICK["bert-base"], 23.5, tuple(rates), rounds=[round_, round_])
    monkeypatch.setattr(bench, "matrix_features", lambda: ("avx512_bf16", "avx512_vnni"))
    text = "\n".join(bench.matrix_units_section(run))
    assert "maskserve openvino / maskserve onnxruntime: req/s at c=64 1.25× (target ≥ 1)" in text
    assert "p50 at c=1, interleaved 0.80× (target ≤ 1" in text
    assert "fastest bfloat16 at c=64: maskserve openvino bf16, 3.00× the req/s of maskserve" in text
    assert "an AMX target, not held here" in text and "the AMX targets were not measured" in text
    assert "1.50× the offline torch float32 pipeline's length-sorted best" in text
    monkeypatch.setattr(bench, "matrix_features", lambda: ("amx_bf16", "amx_tile", "avx512_bf16"))
    text = "\n".join(bench.matrix_units_section(run))
    assert "(target: ≥ 3×)" in text and "not measured" not in text


def test_fleet_report_pairs_the_balancer_s_overhead_inside_each_round() -> None:
    def load(rps: float, latency_ms: float, concurrency: int = 16) -> LoadResult:
        result = LoadResult(concurrency, sent=100, correct=100, duration_s=100 / rps)
        result.statuses["200"] = 100
        result.latencies_ms = [latency_ms] * 100
        return result

    rounds = Rounds(
        [
            Round(
                {
                    DIRECT: Measurement(load(200, 80)),
                    ONE: Measurement(load(190, 84), 0.02),
                    THREE: Measurement(load(150, 100), 0.03),
                },
                {DIRECT: load(100, 9.0, 1), ONE: load(95, 9.5, 1)},
            )
            for _ in range(3)
        ]
    )
    table = render(rounds, parse_args([]), "python -m benchmarks.fleet", "HAProxy version 2.6", (1.0, 1.0, 1.0))
    assert "| 1 replica via HAProxy | 190.0 (190.0–190.0) | 84.0 | 84.0 | 200: 300 | 0 | 200 µs |" in table
    assert "| p50 latency, 1 client (9.00 ms direct) | +0.50 (+0.50–+0.50) ms |" in table
    assert "| p50 latency, 16 clients | +4.00 (+4.00–+4.00) ms |" in table
    assert "| throughput, 3 replicas / 1 replica (both via HAProxy) | 0.79× |" in table


async def test_score_load_scores_each_sentence_once_through_the_real_app(
    make_client: ClientFactory, default_engine: FillMaskEngine
) -> None:
    from benchmarks.agreement import engine_scores
    from benchmarks.score import score_load, score_sentences

    sentences = score_sentences(6)
    client = await make_client(engine=default_engine)
    result = await score_load(str(client.make_url("/score")), sentences, concurrency=3, time_cap_s=60)
    assert result.statuses == Counter({"200": 6}) and sorted(result.scores) == list(range(6))
    assert result.rate > 0
    # Each answer is its own sentence's, as the engine scores it in-process.
    expected = [score.score for score in engine_scores(default_engine, sentences)]
    assert [result.scores[k] for k in range(6)] == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
@pytest.mark.load
def test_one_score_run_measures_minicons_and_maskserve_and_checks_their_scores_agree(tmp_path: Path) -> None:
    pytest.importorskip("minicons", reason="the /score benchmark needs minicons: see benchmarks/score.py")
    from benchmarks.score import BATCH_SIZES, render, run_model, system_name

    run = run_model("default", ("torch",), 1, tmp_path, count=4)
    [round_] = run.rounds
    assert set(round_.minicons) == set(BATCH_SIZES["default"]) and all(rate > 0 for rate in round_.minicons.values())
    for c in (1, 8):
        assert sorted(round_.loads[system_name("torch"), c].scores) == [0, 1, 2, 3]
    report = render([run], "python -m benchmarks.score --test")
    assert "| minicons, batch size 1 | " in report and "| maskserve torch float32, c=8 | " in report
    assert "scores and minicons' are equal within" in report


@pytest.mark.slow
@pytest.mark.load
def test_the_several_models_benchmark_runs_both_layouts_and_reports_ratios_and_memory(tmp_path: Path) -> None:
    from benchmarks import several_models

    folder = default_model_dir()
    assert folder is not None
    out = tmp_path / "several-models.md"
    argv = ["--seconds", "2", "--flood", "4", "--mix", "8", "--large", str(folder), "--out", str(out)]
    assert several_models.main(argv) == 0
    report = out.read_text(encoding="utf-8")
    assert "CPU:" in report and "flags:" in report and "python -m benchmarks.several_models --seconds 2" in report
    rows = [line for line in report.splitlines() if line.startswith(("| one server", "| two servers"))]
    assert len(rows) == 5  # two layouts, two scenarios, and the capped one in the second
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[3]) > 0  # both models answered
        assert cells[6] == "0"  # no wrong or failed answer
        assert float(cells[7]) > 100  # MiB: a server with torch
    assert report.count("One server against two:") == 2


@pytest.mark.slow
@pytest.mark.load
def test_the_repository_benchmark_loads_serves_and_unloads_and_judges_each_target(tmp_path: Path) -> None:
    from benchmarks import repository

    folder = default_model_dir()
    assert folder is not None
    out = tmp_path / "repository.md"
    # The default model in both roles: the phases and the report, not bert-base's memory, are checked.
    argv = ["--requests", "16", "--quiet", "1", "--idle", "1", "--window", "1", "--bursts", "1", "--per-burst", "4"]
    argv += ["--big-model", str(folder), "--out", str(out)]
    assert repository.main(argv) == 0
    report = out.read_text(encoding="utf-8")
    assert "python -m benchmarks.repository --requests 16" in report and "flags:" in report
    assert "load averages" in report
    phases = [line.split("|")[1].strip() for line in report.splitlines() if line.startswith("| ")][1:]
    assert phases[:3] == ["small warm", "small idle", "bert-base loaded"]
    assert "unloaded" in phases and "bursts, idle" in phases
    assert "served 16 requests at c=8" in report and "ms, 0 failed; peak RSS" in report
    latency = [line for line in report.splitlines() if line.startswith(("| nothing loads", "| `bert-base` loads"))]
    assert len(latency) == 2 and all(line.rstrip(" |").endswith("| 0") for line in latency)  # none failed
    verdicts = report.split("| target | met | measured |", 1)[1].strip().splitlines()[1:]
    assert len(verdicts) == 3 and all(line.split("|")[2].strip() in ("yes", "no") for line in verdicts)


@pytest.mark.slow
@pytest.mark.load
def test_the_model_control_benchmark_runs_every_phase_and_judges_each_target(tmp_path: Path) -> None:
    from benchmarks import model_control

    out = tmp_path / "model-control.md"
    assert model_control.main(["--quick", "--out", str(out)]) == 0  # no wrong answer
    report = out.read_text(encoding="utf-8")
    assert "python -m benchmarks.model_control --quick" in report and "flags:" in report
    assert "load averages" in report
    for heading in ("One budget across two workers", "Three reloads under six clients", "An unload beside a load"):
        assert f"## {heading}" in report
    # The budget: both readings of the two workers taken, and every on-demand request answered.
    before = re.search(r"^\| before, after a quiet spell \| (\d+) \| \|$", report, re.M)
    after = re.search(r"^\| after, after a quiet spell \| (\d+) \| [+-]\d+ \|$", report, re.M)
    assert before and after and int(before.group(1)) > 200  # MiB: two workers with torch
    answers = re.search(r"^- answers: (\{.*\}); on-demand loads (\d+)", report, re.M)
    assert answers and int(answers.group(2)) >= 2
    # Every request answered right; on a loaded machine a load may outlast a request's deadline.
    statuses = ast.literal_eval(answers.group(1))
    assert sum(statuses.values()) == 6 and statuses.get("200") and set(statuses) <= {"200", "503", "504"}
    assert "worker 0:" in report and "worker 1:" in report  # both workers' charges
    # The reloads: both routes answered, and the server counted three reloads.
    routes = dict(re.findall(r"^\| (hf|oip) \| \{(.*)\} \|$", report, re.M))
    assert set(routes) == {"hf", "oip"} and all(re.fullmatch(r"'200': \d+", value) for value in routes.values())
    assert "reload ok): 3" in report
    # The unload beside a load: one try with the load's warm-up, one without, each timed.
    tries = re.findall(r"^\| (on|off) \| [\d.]+ \| [\d.]+ \| (?:[\d.]+|-) \| [\d.]+ \| (?:yes|no) \|$", report, re.M)
    assert tries == ["on", "off"]
    verdicts = report.split("| target | met | measured |", 1)[1].strip().splitlines()[1:]
    assert len(verdicts) == 3 and all(line.split("|")[2].strip() in ("yes", "no") for line in verdicts)


def _linear_multiply_adds(counter: FlopCounterMode) -> float:
    """Multiply-adds of the linear layers' products a FlopCounterMode saw (2 FLOPs each counted).

    Linear layers run as mm/addmm. The attention's own products are left out: batched (bmm) where
    transformers 4 runs BERT's attention eagerly, fused into one kernel that is not counted where
    it runs scaled_dot_product_attention.
    """
    counts = counter.get_flop_counts()["Global"]
    return sum(v for k, v in counts.items() if str(k).split(".")[-1] in {"mm", "addmm"}) / 2


def test_the_score_report_s_multiply_adds_are_what_each_side_computes(bert_engine: FillMaskEngine) -> None:
    """The work line of benchmarks/score.py: its formula against the products torch actually runs."""
    from benchmarks.score import multiply_adds
    from maskserve.tasks.pseudo_likelihood import masked_copies
    from maskserve.tasks.windows import Layout

    assert bert_engine.describe()["read_rows_last_layer"] == "yes"
    encoded = bert_engine.tokenizer("the quick brown fox jumps over the lazy dog")
    words = (tuple(encoded["input_ids"]), encoded.word_ids())
    copies = masked_copies(words, bert_engine.mask_token_id, "original", Layout.of(bert_engine)).copies
    minicons, maskserve = multiply_adds(bert_engine.model.config, [len(words[0])], attention=False)
    with torch.inference_mode():
        with FlopCounterMode(display=False) as served:
            bert_engine.predict(copies)
        every_row = torch.tensor([copy.input_ids for copy in copies])
        with FlopCounterMode(display=False) as whole:  # minicons' forward: every layer and the head at every row
            bert_engine.model(input_ids=every_row, attention_mask=torch.ones_like(every_row))
    assert _linear_multiply_adds(served) == maskserve
    assert _linear_multiply_adds(whole) == minicons
    assert minicons > maskserve


def test_the_long_document_is_fixed_and_each_naive_window_is_the_model_s_length_around_its_mask() -> None:
    from benchmarks.long_texts import MODEL_TOKENS, masked_document, naive_windows, plain_text

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    document = masked_document(tokenizer, 4000, 20)
    assert document == masked_document(tokenizer, 4000, 20)
    assert len(document.input_ids) == 4000 and len(document.masks) == 20
    assert [document.input_ids[m] for m in document.masks] == [tokenizer.mask_token_id] * 20
    assert min(b - a for a, b in zip(document.masks, document.masks[1:])) > 0  # spread, one per stretch
    assert len(tokenizer(plain_text(tokenizer, 2000))["input_ids"]) == 2000
    windows = naive_windows(document, tokenizer)
    assert [w.mask for w in windows] == list(document.masks)
    for window in windows:
        ids = tokenizer(window.text)["input_ids"]
        assert len(ids) == MODEL_TOKENS
        local = window.mask - window.start + 1  # after [CLS]
        assert ids[local] == tokenizer.mask_token_id
        assert [i for i, token in enumerate(ids) if token == tokenizer.mask_token_id].index(local) == window.nth
        # The window is the document's own tokens, centred on the mask where the document allows.
        assert ids[1:-1] == list(document.input_ids[window.start : window.start + MODEL_TOKENS - 2])
    assert windows[0].start == 1 and windows[-1].start + MODEL_TOKENS - 2 == 4000 - 1  # clamped at both ends
    middle = windows[len(windows) // 2]
    assert middle.mask - middle.start == (MODEL_TOKENS - 2) // 2


@pytest.mark.slow
@pytest.mark.load
def test_the_long_texts_benchmark_runs_quick_and_reports_its_ratios_and_the_naive_agreement(tmp_path: Path) -> None:
    import math

    from benchmarks.long_texts import QUICK, render, run

    result = run(QUICK, log_dir=tmp_path)
    [round_] = result.rounds
    assert round_.latency is not None and round_.throughput is not None
    assert (round_.latency.answered, round_.throughput.answered) == (1, 8)
    assert round_.latency.windows == round_.throughput.windows and int(round_.latency.windows) > 1
    assert len(round_.latency.tokens) == len(result.naive_tokens) == 20
    assert math.isfinite(round_.throughput_ratio) and round_.throughput_ratio > 0
    assert round_.score_long is not None and round_.score_fit is not None
    assert round_.score_long.windows[0] > 1 and round_.score_fit.windows == [1]
    assert round_.score_long.padded_tokens > 0 and round_.score_long.forward_s > 0
    assert all(math.isfinite(round_.score_ratio(what)) for what in ("padded_tokens", "forward_s", "cpu_s", "wall_s"))
    assert result.work_line[0] > result.work_line[1] > 0  # a 512-token copy is more work than a 250-token one
    assert result.steps is not None and result.steps.answer_bytes > 0
    report = render(result, "python -m benchmarks.long_texts --quick")
    assert "maskserve c=8 / naive loop, documents/s: **" in report and "Agreement with the naive loop:" in report
    assert "Long / fitting, per scored token (target" in report and "AVX-512/AMX flags:" in report
    assert "the work line: multiply-adds **" in report and "measured: forward time **" in report
    assert "python -m benchmarks.long_texts --quick" in report and "--max-masks-per-text 20" in report
    assert "nan" not in report


def test_the_read_rows_benchmark_compares_each_variant_with_its_whole_last_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/read_rows.py on the default model: a row per variant and workload, the saving in
    use on one side only, the answers within float32's rounding of each other."""
    from benchmarks import read_rows

    monkeypatch.setattr(read_rows, "EXPORT_CACHE", tmp_path / "cache")
    out = tmp_path / "read-rows.md"
    argv = ["--models", "default", "--variants", "torch,onnxruntime", "--sentences", "8", "--score-sentences", "2"]
    assert read_rows.main([*argv, "--rounds", "1", "--out", str(out)]) == 0
    report = out.read_text(encoding="utf-8")
    rows = [line.split(" | ") for line in report.splitlines() if line.startswith("| torch float32 |")]
    rows += [line.split(" | ") for line in report.splitlines() if line.startswith("| onnxruntime float32 |")]
    assert [(row[0], row[1]) for row in rows] == [
        ("| torch float32", "fill-mask"),
        ("| torch float32", "/score"),
        ("| onnxruntime float32", "fill-mask"),
        ("| onnxruntime float32", "/score"),
    ]
    for row in rows:
        assert float(row[5].split("×")[0]) > 0
        assert float(row[-1].rstrip(" |")) <= 1e-4  # float32 with and without: the same answers
    assert "matrix features:" in report and "python -m benchmarks.read_rows --models default" in report


def test_the_grpc_report_judges_the_targets_on_the_default_model_only() -> None:
    from benchmarks.grpc import GRPC, POST, QUICK, REST, GrpcRun, Loop, ModelRun, Round, render

    def load(rps: float, p50_ms: float, concurrency: int) -> LoadResult:
        result = LoadResult(concurrency, sent=100, correct=100, duration_s=100 / rps)
        result.statuses["ok"] = 100
        result.latencies_ms = [p50_ms] * 100
        return result

    def model_run(key: str, grpc_rps: float, grpc_p50: float) -> ModelRun:
        def round_() -> Round:
            return Round(
                c1={GRPC: load(100, grpc_p50, 1), REST: load(100, 5.0, 1), POST: load(100, 4.0, 1)},
                c64={
                    name: Loop(load(rps, 90.0, 64), client_cpu_s=0.03, server_cpu_s=0.2)
                    for name, rps in ((GRPC, grpc_rps), (REST, 500.0), (POST, 600.0))
                },
            )

        return ModelRun(key, default_model(), QUICK.counts["default"], [round_(), round_()])

    default_run, bert_run = model_run("default", 550.0, 4.5), model_run("bert-base", 400.0, 6.0)
    bert_run.rounds[0].c64[POST].load.failures += ["12.50s: text 3: ServerDisconnectedError: gone", "2.00s: text 1: x"]
    bert_run.closed = {"idle": 3.0, "write_timeout": 0.0}
    run = GrpcRun(QUICK, [default_run, bert_run], (0, 0, 0), (0, 0, 0))
    report = render(run, "python -m benchmarks.grpc --test")
    default, bert = report.split("\n## ")[1:]
    assert "req/s at c=64: **1.10×** (per round 1.10, 1.10; target ≥ 1×): PASS" in default
    assert "p50 at c=1: **0.90×** (per round 0.90, 0.90; target ≤ 1×): PASS" in default
    assert "minus REST's: median -0.50 ms" in default
    assert "| gRPC ModelInfer | 4.50 | 4.50 | 550.0 | 90.0 | 90.0 | 0.30 | 2.00 | ok: 400 | 0 |" in default
    # bert-base's shape misses both, and is not judged: the targets are the default model's.
    assert "**0.80×**" in bert and "**1.20×**" in bert and "PASS" not in bert and "FAIL" not in bert
    assert "POST /'s first failures (seconds since the client opened): 2.00s: text 1: x; 12.50s: text 3" in bert
    assert "- connections the server closed (`/metrics`): idle 3\n" in bert and "first failures" not in default
    assert "python -m benchmarks.grpc --test" in report and "versions: maskserve" in report and "flags:" in report


@pytest.mark.slow
@pytest.mark.load
def test_the_grpc_benchmark_runs_quick_and_every_client_answers_every_text_right(tmp_path: Path) -> None:
    from benchmarks.grpc import CANNED, QUICK, SYSTEMS, render, run

    result = run(QUICK, log_dir=tmp_path)
    assert [model.key for model in result.models] == [CANNED, "default"]
    assert "idle" in result.models[1].closed  # maskserve's /metrics, scraped at the end
    for model in result.models:  # the canned server first, then maskserve
        [round_] = model.rounds
        counts = QUICK.counts[model.key]
        for name in SYSTEMS:  # each client, both concurrencies: every answer its own text's
            assert (round_.c1[name].sent, round_.c1[name].correct) == (counts.c1, counts.c1)
            assert (round_.c64[name].load.sent, round_.c64[name].load.correct) == (counts.c64, counts.c64)
            assert round_.c64[name].load.rps > 0 and round_.c64[name].client_cpu_s > 0
    report = render(result, "python -m benchmarks.grpc --quick")
    assert report.count("| gRPC ModelInfer | ") == report.count("| REST infer route | ") == 2
    assert report.count("target ≥ 1×): ") == report.count("target ≤ 1×): ") == 1  # the default model's
    assert "the protocols alone (the canned server): " in report and "connections the server closed" in report
    assert "tritonclient 2." in report and "grpcio 1." in report and "nan" not in report


def test_the_batch_benchmarks_comparison_of_two_outputs_catches_a_changed_row() -> None:
    from benchmarks.batch_steps import largest_difference

    one = {"a": {"score": -1.0, "windows": 1}, "b": {"type": "too_long", "message": "m"}}
    assert largest_difference(one, dict(one)) == (True, 0.0)
    assert largest_difference(one, {**one, "a": {"score": -1.5, "windows": 1}}) == (True, 0.5)
    assert largest_difference(one, {**one, "b": {"score": -2.0, "windows": 1}})[0] is False  # an error became a score
    assert largest_difference(one, {"a": one["a"]})[0] is False  # a row is missing


def test_the_whole_words_cloze_set_holds_a_hundred_answers_of_two_or_three_pieces() -> None:
    from benchmarks.cloze_words import CLOZE
    from benchmarks.whole_words import clozes

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    found = clozes(tokenizer, 1000)
    assert len(found) >= 100 and len({c.text for c in found}) == len(found)
    for cloze in found:
        assert tokenizer(cloze.text)["input_ids"].count(tokenizer.mask_token_id) == 1
        assert 2 <= len(cloze.pieces) <= 3 and tokenizer.decode(list(cloze.pieces)) == cloze.answer
    assert all("{mask}" in sentence for sentence, _ in CLOZE)


@pytest.mark.slow
@pytest.mark.load
def test_one_batch_run_measures_the_job_minicons_and_the_server_and_checks_accuracy_and_resume(
    tmp_path: Path,
) -> None:
    pytest.importorskip("minicons", reason="the batch benchmark needs minicons: see benchmarks/score.py")
    from benchmarks.batch import BATCH_SIZES, METRICS, measure, render

    # The shipped sample (201 pairs); minicons on one pair of each paradigm.
    run = measure(None, 0, 1, 1, ray=False, full=False, work=tmp_path)
    [round_] = run.rounds
    assert set(round_.minicons) == set(BATCH_SIZES) and all(rate > 0 for rate in round_.minicons.values())
    assert round_.server > 0 and round_.batch is not None
    assert (round_.batch.rows, round_.batch.results, round_.batch.errors) == (402, 402, 0)
    assert run.server_difference < 1e-4  # the job's scores are POST /score's
    assert set(run.accuracy) == set(METRICS)
    for ours, theirs in run.accuracy.values():
        assert 0 <= ours <= 100 and abs(ours - theirs) <= 0.2
    assert round_.resumed is not None and run.resumed_same
    assert 0 < round_.resumed.parts_at_kill < round_.resumed.parts and round_.resumed.resumed_rows > 0
    report = render(run, "python -m benchmarks.batch --quick")
    assert "| `maskserve batch --task score`, as the job reports it | " in report and "matrix features:" in report
    assert report.count("**met**") + report.count("**not met**") == 5  # two rates, two accuracies, the resume


def test_independent_decoding_ranks_a_word_by_the_product_of_its_masks_probabilities() -> None:
    from benchmarks.whole_words import product_rank

    masks = [{1: 0.5, 2: 0.3, 3: 0.2}, {4: 0.6, 5: 0.4}]
    assert product_rank(masks, (1, 4)) == 1  # 0.30, the best
    # 0.5 x 0.4 = 0.20 is below 0.30 and 0.3 x 0.6 = 0.18 is not: third.
    assert product_rank(masks, (2, 4)) == 3
    assert product_rank(masks, (3, 5)) == 6 and product_rank(masks, (9, 4)) is None


@pytest.mark.slow
@pytest.mark.load
def test_the_whole_words_benchmark_runs_quick_and_reports_each_target_with_its_verdict(tmp_path: Path) -> None:
    from benchmarks.whole_words import QUICK, render, run

    result = run(QUICK, tmp_path)
    assert len(result.clozes) == QUICK.sentences
    assert all(len(result.latency_ms[kind]) == QUICK.sentences for kind in ("plain", "words"))
    assert len(result.throughput) == 1 and all(rate > 0 for rate in result.throughput[0])
    assert len(result.exact) == len(result.word_ranks) == len(result.independent_ranks) == QUICK.sentences
    # A plain fill answers single pieces: never a word of two or three.
    assert result.plain_ranks == [None] * QUICK.sentences
    report = render(result, "python -m benchmarks.whole_words --quick")
    assert report.count("| **met** |") + report.count("| **not met** |") == 3
    assert "python -m benchmarks.whole_words --quick" in report and "AVX-512/AMX flags:" in report
    assert "nan" not in report


def test_the_precision_rates_report_takes_each_pair_s_ratio_inside_each_round() -> None:
    from benchmarks import precision_rates
    from benchmarks.run import Round as ServerRound

    def load(rps: float) -> LoadResult:
        result = LoadResult(precision_rates.CONCURRENCY, sent=100, correct=100, duration_s=100 / rps)
        result.statuses["200"] = 100
        result.latencies_ms = [100.0] * 100
        return result

    rates = [  # per round: float32, bf16 today, bf16 before, int8 today, int8 before
        (40.0, 76.0, 80.0, 110.0, 100.0),
        (20.0, 36.0, 40.0, 60.0, 60.0),  # a slow round: its ratios count as any other's
        (42.0, 90.0, 90.0, 120.0, 100.0),
    ]
    rounds = []
    for per_system in rates:
        round_ = ServerRound()
        for system, rps in zip(precision_rates.SYSTEMS, per_system, strict=True):
            round_.loads[system.name, precision_rates.CONCURRENCY] = load(rps)
        rounds.append(round_)
    plan = precision_rates.PLANS["bert-base"]
    report = precision_rates.render(BenchModel("bert-base shape", Path(".")), plan, rounds, "cmd")
    assert "| openvino bf16, whole (before) | 80.0 (40.0-90.0) | 100 | 100 | 200: 300 | 0 |" in report
    # bf16: 0.95, 0.90, 1.00 -> median 0.95; int8: 1.10, 1.00, 1.20 -> 1.10
    assert "| openvino bf16, whole (before) | 0.95× (0.90-1.00) |" in report
    assert "| openvino int8, the recipe before | 1.10× (1.00-1.20) |" in report
    assert "CPU: " in report and "matrix features: " in report  # every report prints its CPU's flags


@pytest.mark.skipif(not HAS_OPENVINO, reason="needs openvino")
def test_the_servers_before_serve_the_whole_bfloat16_graph_and_the_int8_recipe_before() -> None:
    from benchmarks import precision_before_server
    from benchmarks.precision_parts import before
    from maskserve.engine import openvino as ov_engine
    from maskserve.engine.openvino_quantize import recipe_for

    attribute, replacement = precision_before_server.VARIANTS["int8-before"]
    assert getattr(ov_engine, attribute) is recipe_for  # the server replaces what the loader calls
    assert replacement() == before() != recipe_for()
    attribute, replacement = precision_before_server.VARIANTS["bf16-whole"]
    assert getattr(ov_engine, attribute) is ov_engine.compile_bfloat16
