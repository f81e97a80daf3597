"""The ``maskserve`` command as an operator meets it: refusals at start-up, and a real run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import HAS_ONNXRUNTIME, HAS_OPENVINO, NO_ONNXRUNTIME, NO_OPENVINO
from .live_server import free_port
from .models import build_bert, build_maskless

START_TIMEOUT_S = 60.0


def cli_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "maskserve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
        check=False,
    )


@pytest.mark.slow
def test_unservable_models_exit_non_zero_with_a_clear_message(tmp_path: Path) -> None:
    cases = {
        "missing": (str(tmp_path / "nowhere"), "could not load model"),
        "headless": (str(build_bert(tmp_path / "headless", with_head=False)), "lacks"),
        "maskless": (str(build_maskless(tmp_path / "maskless")), "no mask token"),
        "hub-id-offline": ("no-such-org/no-such-model", "could not load model"),
    }
    # Started together: each one pays torch's import time, and they need not pay it in turn.
    processes = {
        kind: subprocess.Popen(
            [sys.executable, "-m", "maskserve", "--model", model, "--port", "0", "--torch-threads", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        for kind, (model, _) in cases.items()
    }
    for kind, process in processes.items():
        _, stderr = process.communicate(timeout=120)
        expected = cases[kind][1]
        assert process.returncode == 1, f"{kind}: {stderr}"
        assert "cannot start" in stderr and expected in stderr, f"{kind}: {stderr}"
        assert "Traceback" not in stderr, f"{kind}: {stderr}"


@pytest.mark.slow
def test_port_in_use_exits_1_with_a_clear_message() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--port", str(port), "--torch-threads", "1")
    assert result.returncode == 1
    assert "cannot start" in result.stderr and f"127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_setting_exits_2_naming_flag_and_value() -> None:
    result = run_cli("--port", "http")
    assert result.returncode == 2
    assert "--port" in result.stderr and "'http'" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_environment_setting_exits_2_naming_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "maskserve"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**cli_env(), "MASKSERVE_MAX_BATCH_SIZE": "zero"},
        check=False,
    )
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


def wait_until_serving(process: subprocess.Popen[str], url: str) -> list[dict[str, object]]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            return post_raw(url, b"Paris is the [MASK] of France.")
        except (urllib.error.URLError, ConnectionError):
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.slow
def test_cli_serves_the_seed_curl_on_the_default_model_and_stops_cleanly_on_sigterm() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "maskserve", "--port", str(port), "--torch-threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        answer = wait_until_serving(process, f"http://127.0.0.1:{port}/")
        assert len(answer) == 5
        assert answer[0]["token_str"] == "city"
        assert answer[0]["sequence"] == "paris is the city of france."
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.slow
def test_a_stop_signal_while_the_model_loads_exits_at_once_and_cleanly() -> None:
    """A pod deleted during a slow start: SIGTERM before the server listens ends it at once, with
    exit 0 and no traceback (as a container's PID 1 it would otherwise be ignored)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "maskserve", "--port", str(free_port()), "--torch-threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(),
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # until the engine starts loading (torch is imported by then)
            lines.append(line)
            if "loading model from" in line:
                break
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    output = "".join(lines) + rest
    assert process.returncode == 0, output
    assert "stopped before serving" in output and "Traceback" not in output


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
    port = free_port()
    cases = {
        "exporter fails": (["--cache-dir", str(tmp_path / "cache")], {"PYTHONPATH": str(hooks)}),
        "cache unwritable": (["--cache-dir", str(not_a_folder)], {}),
    }
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "maskserve", "--backend", "onnxruntime", "--model", model, "--port", str(port)]
            + args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**cli_env(), **env},
        )
        for name, (args, env) in cases.items()
    }
    expected = {
        "exporter fails": "cannot start: could not export the model to ONNX: Exporting the operator "
        "'aten::fake_op' to ONNX opset version 17 is not supported.",
        "cache unwritable": f"cannot start: cannot write the export cache in {not_a_folder}/onnx: Not a directory",
    }
    for name, process in processes.items():
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 2, f"{name}: {stderr}"
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
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "maskserve", "--backend", "onnxruntime", "--cache-dir", str(tmp_path)]
            + ["--port", str(port), "--torch-threads", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        try:
            answer = wait_until_serving(process, f"http://127.0.0.1:{port}/")
            assert answer[0]["token_str"] == "city"
            assert answer[0]["sequence"] == "paris is the city of france."
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
            assert process.returncode == 0, stderr
            logs.append(stderr)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert "exporting" in logs[0] and "new export" in logs[0]
    assert "exporting" not in logs[1] and "cached export" in logs[1]
    [entry] = (tmp_path / "onnx").iterdir()
    assert entry.name in logs[1]


@pytest.mark.skipif(not HAS_OPENVINO, reason=NO_OPENVINO)
def test_openvino_backend_refuses_what_it_does_not_run_with_exit_2(tmp_path: Path) -> None:
    result = run_cli("--backend", "openvino", "--dtype", "float16", "--cache-dir", str(tmp_path), "--port", "0")
    assert result.returncode == 2, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "cannot start" in line]
    assert "--dtype float16" in line and "--backend torch" in line
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not HAS_OPENVINO, reason=NO_OPENVINO)
def test_openvino_backend_serves_the_default_model_and_reuses_its_graph_on_restart(tmp_path: Path) -> None:
    logs = []
    for _ in range(2):
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "maskserve", "--backend", "openvino", "--cache-dir", str(tmp_path)]
            + ["--port", str(port), "--threads", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        try:
            answer = wait_until_serving(process, f"http://127.0.0.1:{port}/")
            assert answer[0]["token_str"] == "city"
            assert answer[0]["sequence"] == "paris is the city of france."
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
            assert process.returncode == 0, stderr
            logs.append(stderr)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert "converting" in logs[0] and "new graph" in logs[0]
    assert "converting" not in logs[1] and "cached graph" in logs[1]
    # The start-up log names the CPU's matrix features and the precision in effect.
    assert "CPU matrix features:" in logs[0] and "on openvino float32" in logs[1]
    [entry] = (tmp_path / "openvino").iterdir()
    assert entry.name in logs[1]
