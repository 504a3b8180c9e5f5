"""The Hub is reached through huggingface_hub's own HTTP client: HF_ENDPOINT, proxies from
the environment and HF_HUB_OFFLINE are honoured, and refusals are told apart by their HTTP
status. Everything runs against HTTP servers on 127.0.0.1 started here."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import HUB_ONLINE, assert_clean_failure, lmctl

pytestmark = pytest.mark.e2e

NO_PROXY_ENV = {
    name: ""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
}


@dataclass
class Server:
    """Answers every request with ``status``; records each request line's target."""

    status: int = 200
    seen: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            state.seen.append(self.path)
            body = b'{"error": "refused by the test server"}'
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def _train_from_hub(tmp_path: Path, text_files: tuple[Path, Path], env: dict[str, str]) -> object:
    train, _ = text_files
    return lmctl(
        "train",
        "clm",
        "--model-name-or-path",
        "some-org/tiny-model",
        "--train-file",
        train,
        "--max-steps",
        "1",
        "--output-dir",
        tmp_path / "run",
        env={**NO_PROXY_ENV, **HUB_ONLINE, "NO_PROXY": "", "no_proxy": "", **env},
        timeout=120,
    )


@pytest.mark.parametrize(
    "case",
    [
        (401, 7, "HTTP 401"),
        (403, 7, "HTTP 403"),
        (404, 5, "not found on the Hub"),
        (503, 6, "unreachable"),
    ],
    ids=["401", "403", "404", "503"],
)
def test_hub_answers_map_to_exit_codes(
    server: Server, tmp_path: Path, text_files: tuple[Path, Path], case: tuple[int, int, str]
) -> None:
    status, code, needle = case
    server.status = status
    proc = _train_from_hub(tmp_path, text_files, {"HF_ENDPOINT": server.url})
    assert_clean_failure(proc, code, "some-org/tiny-model", needle)  # type: ignore[arg-type]
    if status < 500:
        assert any("some-org/tiny-model" in path for path in server.seen), server.seen
    assert not (tmp_path / "run").exists()


def test_the_hub_is_reached_through_the_proxy(
    server: Server, tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    server.status = 404
    # The endpoint's name does not resolve: only a client that talks to the proxy gets anywhere.
    proxy = {
        name: server.url for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy")
    }
    endpoint = "http://hub.lmctl-test.invalid"
    proc = _train_from_hub(tmp_path, text_files, {"HF_ENDPOINT": endpoint, **proxy})
    assert_clean_failure(proc, 5, "some-org/tiny-model", "not found on the Hub")  # type: ignore[arg-type]
    assert server.seen, "the proxy was not used"
    assert all(path.startswith(endpoint + "/") for path in server.seen), server.seen
    assert any("some-org/tiny-model" in path for path in server.seen), server.seen


def test_offline_mode_fails_fast_without_a_request(
    server: Server, tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    proc = _train_from_hub(tmp_path, text_files, {"HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "1"})
    assert_clean_failure(proc, 6, "some-org/tiny-model", "HF_HUB_OFFLINE")  # type: ignore[arg-type]
    assert server.seen == []


def _probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """lmctl's Hub probe in a fresh process (no client or settings left by another test)."""
    code = "from lmctl.storage.hub import hub_reachable; print(hub_reachable())"
    full_env = {**os.environ, **NO_PROXY_ENV, **env}
    full_env.pop("TRANSFORMERS_OFFLINE", None)
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, check=True
    )


def test_probe_uses_the_endpoint(server: Server) -> None:
    assert _probe({"HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0"}).stdout.strip() == "True"
    assert server.seen
    server.seen.clear()
    assert _probe({"HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "1"}).stdout.strip() == "False"
    assert server.seen == []
