"""The `mnemo` command (app/cli.py): every setting a flag of `mnemo serve`, chosen models, `mnemo models`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from app.cli import cli, flag_name
from app.core.settings import Settings
from tests.conftest import COMMITTED, KT_MODEL, manifest_models
from tests.helpers import ROOT, free_port, run_app, running_server


def no_manifest(directory: object) -> str:
    """The one message for a directory without a manifest: its path, the variable, the committed models' command."""
    return (
        f"no manifest.json in {directory}: set MNEMO_ARTIFACTS_DIR (--artifacts-dir) to a directory that has one, "
        "such as a checkout's artifacts/ (the committed models, which `make serve` serves)"
    )


def test_serve_help_lists_a_flag_and_its_variable_for_every_setting():
    shown = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200)
    assert shown.exit_code == 0
    for name in Settings.model_fields:
        assert flag_name(name) in shown.output, name
        assert f"MNEMO_{name.upper()}" in shown.output, name


def test_mnemo_help_lists_the_commands():
    shown = CliRunner().invoke(cli, ["--help"])
    assert shown.exit_code == 0 and "serve" in shown.output and "models" in shown.output


def test_models_prints_every_manifest_entry_with_its_version():
    listed = CliRunner().invoke(cli, ["models", "--artifacts", str(COMMITTED)])
    assert listed.exit_code == 0
    lines = listed.output.splitlines()
    assert lines[0].split() == ["name", "task", "version", "default", "size", "metrics"]
    for model in manifest_models(COMMITTED):
        [line] = [line for line in lines[1:] if line.split()[0] == model["name"]]
        assert line.split()[1:3] == [model["task"], model["version"]]
    as_json = CliRunner().invoke(cli, ["models", "--artifacts", str(COMMITTED), "--json"])
    assert [entry["name"] for entry in json.loads(as_json.output)] == [m["name"] for m in manifest_models(COMMITTED)]


def test_models_leaves_out_a_metric_the_manifest_gives_as_null(tmp_path):
    manifest = {"models": manifest_models(COMMITTED)}
    manifest["models"][0]["metrics"] = {"test_auc": None, "test_accuracy": 0.75}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    listed = CliRunner().invoke(cli, ["models", "--artifacts", str(tmp_path)])
    assert listed.exit_code == 0, listed.exception
    assert listed.output.splitlines()[1].endswith("accuracy 0.75")


def test_models_of_a_directory_without_a_manifest_is_one_line_and_status_1(tmp_path):
    listed = CliRunner().invoke(cli, ["models", "--artifacts", str(tmp_path)])
    assert listed.exit_code == 1
    assert listed.output.strip() == f"Error: {no_manifest(tmp_path)}"


def test_an_unreadable_manifest_is_one_line_naming_it_and_status_1(tmp_path):
    """/proc/self/mem is a file that even root cannot read from its start (EIO): no traceback, here or at serve."""
    (tmp_path / "manifest.json").symlink_to("/proc/self/mem")
    expected = f"cannot read {tmp_path / 'manifest.json'}: Input/output error"
    listed = CliRunner().invoke(cli, ["models", "--artifacts", str(tmp_path)])
    assert listed.exit_code == 1 and listed.output.strip() == f"Error: {expected}"
    done = run_app({**os.environ, "MNEMO_ARTIFACTS_DIR": str(tmp_path), "MNEMO_PORT": str(free_port())})
    assert done.returncode == 1 and done.stderr.strip() == f"mnemo: cannot start: {expected}"


def test_a_flag_wins_over_its_variable_and_a_bad_flag_is_named():
    env = {**os.environ, "MNEMO_PORT": "not-a-port", "MNEMO_ARTIFACTS_DIR": "/nonexistent"}
    done = run_app(env, "--port", str(free_port()))
    assert done.returncode == 1  # the port flag was taken: the next problem is the artifacts directory
    assert done.stderr.strip() == f"mnemo: cannot start: {no_manifest('/nonexistent')}"  # as `mnemo models` says it
    done = run_app({**os.environ}, "--port", "99999")
    assert done.returncode == 2 and "--port: Input should be less than or equal to 65535" in done.stderr


def test_a_bad_state_url_flag_is_named_as_the_flag():
    done = run_app({**os.environ, "MNEMO_PORT": str(free_port())}, "--state-url", "foo://x")
    assert done.returncode == 2 and "MNEMO_STATE_URL" not in done.stderr
    assert "Error: --state-url must start with sqlite:// or redis://" in done.stderr


def test_a_port_flag_that_cannot_be_listened_on_is_named_as_the_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_app({**os.environ, "MNEMO_HOST": "127.0.0.1"}, "--port", str(port))
    assert done.returncode == 2 and "MNEMO_PORT" not in done.stderr
    assert f"Error: cannot listen on 127.0.0.1:{port} (MNEMO_HOST:--port): Address already in use" in done.stderr


@pytest.mark.parametrize("variable", ["MNEMO_CPU_ARENA", "MNEMO_CUDA_TF32"])
def test_a_switch_unset_on_the_command_line_leaves_its_variable_in_force(variable: str):
    done = run_app({**os.environ, variable: "maybe"}, "--port", str(free_port()))  # read, so refused
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"mnemo: cannot start: invalid settings: {variable}: Input should be a valid boolean, unable to interpret input"
    )


def test_an_unknown_model_stops_startup_naming_the_choices():
    done = run_app({**os.environ, "MNEMO_PORT": str(free_port())}, "--models", "dkvmn-nope")
    assert done.returncode == 1
    names = ", ".join(sorted(model["name"] for model in manifest_models(COMMITTED)))
    expected = f"--models/MNEMO_MODELS names dkvmn-nope, which the manifest does not have; its models: {names}"
    assert done.stderr.strip() == f"mnemo: cannot start: {expected}"


@pytest.mark.slow
def test_serve_with_chosen_models_serves_only_them_and_says_where():
    command = [sys.executable, "-m", "app.cli", "serve", "--port", "{port}", "--models", KT_MODEL]
    with running_server(COMMITTED, command=command) as server:
        served = httpx.get(f"{server.url}/models", timeout=10).json()["models"]
        assert [model["name"] for model in served] == [KT_MODEL]
        answer = httpx.post(
            f"{server.url}/knowledge-trace",
            json={"interactions": [{"question": 1, "correct": True}], "next_questions": [2]},
            timeout=10,
        )
        assert answer.status_code == 200 and answer.json()["model"] == KT_MODEL
    messages = [json.loads(line)["message"] for line in server.output if line.startswith("{")]
    assert f"serving {KT_MODEL} on {server.url}" in messages


@pytest.mark.slow
@pytest.mark.parametrize("keep_alive", ["30", "not-a-number"])
def test_a_flag_wins_over_its_variable_in_the_workers_too(keep_alive: str):
    """The workers take the flags' settings, not the environment's: a kept-alive connection closes after
    --keep-alive-s 1 although MNEMO_KEEP_ALIVE_S is 30 (or invalid: the flag replaces it)."""
    command = [sys.executable, "-m", "app", "--port", "{port}", "--models", KT_MODEL, "--keep-alive-s", "1"]
    with running_server(COMMITTED, command=command, MNEMO_KEEP_ALIVE_S=keep_alive) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            started, received = time.monotonic(), b""
            while chunk := sock.recv(65536):
                received += chunk
            closed_after_s = time.monotonic() - started
    assert received.startswith(b"HTTP/1.1 200") and closed_after_s < 5


def test_importing_the_command_imports_neither_onnxruntime_nor_torch():
    code = "import sys, app.cli; print(sorted({'onnxruntime', 'torch'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_an_ipv6_host_is_bracketed_in_the_url_it_says_and_served_there():
    port = free_port()
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "::1", "--port", str(port), "--models", KT_MODEL]
    environment = {
        **os.environ,
        "MNEMO_ARTIFACTS_DIR": str(COMMITTED),
        "MNEMO_PROVIDER": "cpu",
        "MNEMO_LOG_FORMAT": "json",
    }
    with subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True, cwd=ROOT) as process:
        try:
            line = json.loads(process.stderr.readline())["message"]
            assert line == f"serving {KT_MODEL} on http://[::1]:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    assert httpx.get(f"http://[::1]:{port}/ready", timeout=5).status_code == 200
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and process.poll() is None, "it never served on [::1]"
                    time.sleep(0.2)
        finally:
            process.terminate()
            process.wait(timeout=60)


def test_models_reads_the_artifacts_directory_from_its_variable(tmp_path):
    listed = CliRunner().invoke(cli, ["models"], env={"MNEMO_ARTIFACTS_DIR": str(tmp_path)})
    assert listed.exit_code == 1
    assert listed.output.strip() == f"Error: {no_manifest(tmp_path)}"
