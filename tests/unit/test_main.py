"""The ``maskserve`` command as an operator meets it: refusals at start-up, and a real run."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from maskserve.__main__ import log_followed_defaults
from maskserve.config.flags import load_settings
from tests.conftest import HAS_ONNXRUNTIME, HAS_OPENVINO, NO_ONNXRUNTIME, NO_OPENVINO
from tests.live_server import maskserve_process, run_maskserve, start_maskserve
from tests.models import build_bert, build_maskless


@pytest.mark.slow
def test_unservable_models_exit_non_zero_with_a_clear_message(tmp_path: Path) -> None:
    cases = {
        "missing": (str(tmp_path / "nowhere"), "could not load model"),
        "headless": (str(build_bert(tmp_path / "headless", with_head=False)), "lacks"),
        "maskless": (str(build_maskless(tmp_path / "maskless")), "no mask token"),
        "hub-id-offline": ("no-such-org/no-such-model", "could not load model"),
    }
    # Started together: each one pays torch's import time, and they need not pay it in turn.
    servers = {
        kind: start_maskserve("--model", model, "--torch-threads", "1", log_path=tmp_path / f"{kind}.log")
        for kind, (model, _) in cases.items()
    }
    for kind, server in servers.items():
        exit_code, output = server.wait(120), server.log()
        expected = cases[kind][1]
        assert exit_code == 1, f"{kind}: {output}"
        assert "cannot start" in output and expected in output, f"{kind}: {output}"
        assert "Traceback" not in output, f"{kind}: {output}"


@pytest.mark.slow
def test_a_model_path_that_is_missing_or_a_file_exits_1_naming_the_folder(tmp_path: Path) -> None:
    home, nowhere, a_file = tmp_path / "home", tmp_path / "nowhere", tmp_path / "config.json"
    a_file.write_text("{}", encoding="utf-8")
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - name: a\n    source: {a_file}\n  - name: b\n", encoding="utf-8")
    cases = {
        "absolute": (("--model", str(nowhere)), f"could not load model {str(nowhere)!r}: no such folder {nowhere}"),
        # The child runs in this test's working folder.
        "dot-slash": (
            ("--model", "./no-such-model"),
            f"could not load model './no-such-model': no such folder {Path.cwd() / 'no-such-model'}",
        ),
        "named, under ~": (
            ("--model", "small=~/models/bert"),
            f"could not load model '~/models/bert': no such folder {home / 'models/bert'}",
        ),
        "a file, in a models file": (
            ("--models-file", str(models)),
            f"model 'a': could not load model {str(a_file)!r}: {a_file} is a file, not a folder: give the model's "
            "folder",
        ),
    }
    # Started together: each one pays torch's import time, and they need not pay it in turn.
    servers = {
        kind: start_maskserve(*args, "--torch-threads", "1", log_path=tmp_path / f"{kind}.log", env={"HOME": str(home)})
        for kind, (args, _) in cases.items()
    }
    for kind, server in servers.items():
        exit_code, output = server.wait(120), server.log()
        assert exit_code == 1, f"{kind}: {output}"
        [line] = [line for line in output.splitlines() if "cannot start" in line]
        assert line.endswith(f"cannot start: {cases[kind][1]}"), f"{kind}: {line}"
        assert "Traceback" not in output, f"{kind}: {output}"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_missing_model_folder_is_refused_before_torch_is_imported(workers: str, tmp_path: Path) -> None:
    """A typo in --model fails at once: the check runs before the engine's imports, which take seconds."""
    missing = tmp_path / "nowhere"
    code = (
        "import sys\n"
        "from maskserve.__main__ import main\n"
        f"status = main(['--model', {str(missing)!r}, '--workers', {workers!r}])\n"
        "print('exit', status, 'torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.stdout.strip() == "exit 1 torch not imported", result.stdout + result.stderr
    assert f"cannot start: could not load model {str(missing)!r}: no such folder {missing}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_port_in_use_exits_2_with_a_clear_message() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_maskserve("--port", str(port), "--torch-threads", "1")
    assert result.returncode == 2
    assert "cannot start" in result.stderr and f"127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_setting_exits_2_naming_flag_and_value() -> None:
    result = run_maskserve("--port", "http")
    assert result.returncode == 2
    assert "--port" in result.stderr and "'http'" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_flag_exits_2_naming_it() -> None:
    result = run_maskserve("--max-batch", "4")
    assert result.returncode == 2
    assert result.stderr.startswith("maskserve: ") and "--max-batch" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--max-inputs", "300", "--max-queue", "256"), ("--max-inputs", "--max-queue")),
        (("--default-top-k", "50", "--max-top-k", "10"), ("--default-top-k", "--max-top-k")),
        (("--max-queue", "8", "--max-score-tokens", "64"), ("--max-score-tokens=64", "--max-queue=8")),
        (("--api-key", "k" * 20, "--middleware", "default,-auth"), ("--middleware", "--api-key")),
    ],
    ids=["inputs_above_queue", "default_top_k_above_max", "score_tokens_above_queue", "api_key_without_auth"],
)
def test_contradictory_settings_exit_2_naming_both(args: tuple[str, ...], named: tuple[str, str]) -> None:
    result = run_maskserve(*args)
    assert result.returncode == 2, result.stderr
    assert all(name in result.stderr for name in named), result.stderr
    assert "Traceback" not in result.stderr and "k" * 20 not in result.stderr


def test_bad_environment_setting_exits_2_naming_variable() -> None:
    result = run_maskserve(env={"MASKSERVE_MAX_BATCH_SIZE": "zero"})
    assert result.returncode == 2
    assert "MASKSERVE_MAX_BATCH_SIZE" in result.stderr and "'zero'" in result.stderr


def post_raw(url: str, body: bytes) -> list[dict[str, object]]:
    # Exactly what `curl -X POST -d "..." URL` sends.
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: list[dict[str, object]] = json.loads(response.read())
        return answer


@pytest.mark.slow
def test_cli_serves_the_seed_curl_on_the_default_model_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    with maskserve_process("--torch-threads", "1", log_dir=tmp_path) as server:
        answer = post_raw(server.url + "/", b"Paris is the [MASK] of France.")
        assert len(answer) == 5
        assert answer[0]["token_str"] == "city"
        assert answer[0]["sequence"] == "paris is the city of france."
        assert server.stop() == 0, server.log()
        assert "Traceback" not in server.log()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env"), [(("--max-queue", "8"), {}), ((), {"MASKSERVE_MAX_QUEUE": "8"})], ids=["flag", "variable"]
)
def test_a_small_queue_set_alone_starts_and_the_limits_it_bounds_follow_it(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str]
) -> None:
    with maskserve_process(*args, log_dir=tmp_path, env=env) as server:
        assert post_raw(server.url + "/", b"Paris is the [MASK] of France.")[0]["token_str"] == "city"
        with urllib.request.urlopen(server.url + "/info", timeout=30) as response:
            info = json.loads(response.read())
        log = server.log()
    assert info["breaker"]["max_queue"] == 8
    limits = info["limits"]
    assert (limits["max_inputs"], limits["max_score_tokens"], limits["max_word_copies"]) == (8, 8, 8)
    follows = {"max_inputs": "max_queue", "max_score_tokens": "max_queue", "max_word_copies": "max_queue"}
    assert info["defaults_followed"] == follows and info["models"][0]["defaults_followed"] == follows
    # Said once at start-up, each with the value it took and the one it follows.
    for flag in ("--max-inputs", "--max-score-tokens", "--max-word-copies"):
        assert log.count(f"{flag} is 8: its default follows --max-queue=8") == 1, log


def test_the_start_up_log_says_each_moved_default_once_the_models_files_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: small\n    max_queue: 4\n", encoding="utf-8")
    settings = load_settings(["--max-queue", "16", "--model", "big=", "--models-file", str(models)], env={})
    with caplog.at_level(logging.INFO, logger="maskserve"):
        log_followed_defaults(settings)
    lines = [record.getMessage() for record in caplog.records]
    assert lines.count("--max-score-tokens is 16: its default follows --max-queue=16") == 1
    assert lines.count("model 'small': max_score_tokens is 4: its default follows max_queue=4") == 1
    assert not any("'big'" in line for line in lines)  # a --model model runs on the server's settings
    assert len(lines) == 6, lines


@pytest.mark.slow
def test_a_name_with_no_source_serves_the_default_model_under_that_name(tmp_path: Path) -> None:
    with maskserve_process("--model", "small=", log_dir=tmp_path) as server:
        answer = post_raw(server.url + "/models/small", b"Paris is the [MASK] of France.")
        with urllib.request.urlopen(server.url + "/info", timeout=30) as response:
            info = json.loads(response.read())
    assert answer[0]["token_str"] == "city"
    assert [model["name"] for model in info["models"]] == ["small"] and info["model"]["name"] == "small"


# A stop during the load must not wait for the load to end: with the default model the rest of
# the load (the weights, the checks, the warm-up) takes longer than this, on 2 busy cores too.
EXITS_AT_ONCE_S = 3.0


@pytest.mark.slow
def test_a_stop_signal_while_the_model_loads_exits_at_once_and_cleanly(tmp_path: Path) -> None:
    """A pod deleted during a slow start: SIGTERM before the server listens ends it at once, with
    exit 0 and no traceback (as a container's PID 1 it would otherwise be ignored)."""
    # A model that loads slowly: a sitecustomize in the child makes every weight file read wait.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_LOAD, encoding="utf-8")
    server = start_maskserve("--torch-threads", "1", log_path=tmp_path / "server.log", env={"PYTHONPATH": str(hooks)})
    try:
        server.wait_for_log("loading model from")  # torch is imported and the load has begun
        stopped = time.monotonic()
        server.signal(signal.SIGTERM)
        exit_code = server.wait(30)
        took = time.monotonic() - stopped
    finally:
        server.kill()
    output = server.log()
    assert exit_code == 0, output
    assert "stopped before serving" in output and "Traceback" not in output
    assert "model ready" not in output  # it did not wait for the load to finish
    assert took < EXITS_AT_ONCE_S, (took, output)


# Loaded by the child interpreter (PYTHONPATH): loading the weights takes ten seconds longer.
SLOW_LOAD = """
import time
import transformers

_load = transformers.AutoModelForMaskedLM.from_pretrained.__func__


def _slow(cls, *args, **kwargs):
    time.sleep(10)
    return _load(cls, *args, **kwargs)


transformers.AutoModelForMaskedLM.from_pretrained = classmethod(_slow)
"""


# Loaded by the child interpreter (PYTHONPATH): the exporter fails as torch.onnx fails on an
# operator it cannot export, with its usual multi-line message.
FAILING_EXPORTER = """
import torch.onnx

def _export(*args, **kwargs):
    raise RuntimeError(
        "Exporting the operator 'aten::fake_op' to ONNX opset version 17 is not supported.\\n"
        "Please feel free to request support or submit a pull request on PyTorch GitHub."
    )

torch.onnx.export = _export
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ONNXRUNTIME, reason=NO_ONNXRUNTIME)
def test_onnxruntime_backend_that_cannot_export_exits_2_with_one_clear_line(tmp_path: Path) -> None:
    model = str(build_bert(tmp_path / "bert"))
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(FAILING_EXPORTER, encoding="utf-8")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("", encoding="utf-8")
    cases = {
        "exporter fails": (["--cache-dir", str(tmp_path / "cache")], {"PYTHONPATH": str(hooks)}),
        "cache unwritable": (["--cache-dir", str(not_a_folder)], {}),
    }
    servers = {
        name: start_maskserve(
            "--backend", "onnxruntime", "--model", model, *args, log_path=tmp_path / f"{name}.log", env=env
        )
        for name, (args, env) in cases.items()
    }
    expected = {
        "exporter fails": "cannot start: could not export the model to ONNX: Exporting the operator "
        "'aten::fake_op' to ONNX opset version 17 is not supported.",
        "cache unwritable": f"cannot start: cannot write the export cache in {not_a_folder}/onnx: Not a directory",
    }
    for name, server in servers.items():
        exit_code, stderr = server.wait(120), server.log()
        assert exit_code == 2, f"{name}: {stderr}"
        [line] = [line for line in stderr.splitlines() if "cannot start" in line]
        assert line.endswith(expected[name]), f"{name}: {stderr}"
        assert "Traceback" not in stderr and "Please feel free" not in stderr, f"{name}: {stderr}"
        assert "serving" not in stderr, f"{name}: {stderr}"  # nothing was served instead
    assert (
        not (tmp_path / "cache" / "onnx").exists()
        or [p for p in (tmp_path / "cache" / "onnx").iterdir() if not p.name.startswith(".")] == []
    )


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ONNXRUNTIME, reason=NO_ONNXRUNTIME)
def test_onnxruntime_backend_serves_the_default_model_and_reuses_its_export_on_restart(tmp_path: Path) -> None:
    logs = []
    for _ in range(2):
        with maskserve_process(
            "--backend", "onnxruntime", "--cache-dir", str(tmp_path), "--torch-threads", "1", log_dir=tmp_path
        ) as server:
            answer = post_raw(server.url + "/", b"Paris is the [MASK] of France.")
            assert answer[0]["token_str"] == "city"
            assert answer[0]["sequence"] == "paris is the city of france."
            assert server.stop() == 0, server.log()
            logs.append(server.log())
    assert "exporting" in logs[0] and "new export" in logs[0]
    assert "exporting" not in logs[1] and "cached export" in logs[1]
    assert "CPU matrix features:" in logs[0]
    [entry] = [p for p in (tmp_path / "onnx").iterdir()]
    assert entry.name in logs[1]


@pytest.mark.skipif(not HAS_OPENVINO, reason=NO_OPENVINO)
def test_openvino_backend_refuses_what_it_does_not_run_with_exit_2(tmp_path: Path) -> None:
    result = run_maskserve("--backend", "openvino", "--dtype", "float16", "--cache-dir", str(tmp_path), "--port", "0")
    assert result.returncode == 2, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "cannot start" in line]
    assert "--dtype float16" in line and "--backend torch" in line
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not HAS_OPENVINO, reason=NO_OPENVINO)
def test_openvino_backend_serves_the_default_model_and_reuses_its_graph_on_restart(tmp_path: Path) -> None:
    logs = []
    for _ in range(2):
        with maskserve_process(
            "--backend", "openvino", "--cache-dir", str(tmp_path), "--threads", "1", log_dir=tmp_path
        ) as server:
            answer = post_raw(server.url + "/", b"Paris is the [MASK] of France.")
            assert answer[0]["token_str"] == "city"
            assert answer[0]["sequence"] == "paris is the city of france."
            assert server.stop() == 0, server.log()
            logs.append(server.log())
    assert "converting" in logs[0] and "new graph" in logs[0]
    assert "converting" not in logs[1] and "cached graph" in logs[1]
    # The start-up log names the CPU's matrix features and the precision in effect.
    assert "CPU matrix features:" in logs[0] and "on openvino float32" in logs[1]
    [entry] = [p for p in (tmp_path / "openvino").iterdir()]
    assert entry.name in logs[1]
