"""The loopback provider's log never shows a request's query string (it can hold an api-key)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import pytest

from awaken_langchain.testing import LoopbackProvider, Scenario

SECRET = "sk-query-secret-123"


def _post(url: str, body: object) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except urllib.error.HTTPError as error:
        error.read()


def test_request_log_lines_name_the_path_without_the_query_string(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="awaken_langchain.testing.server")
    with LoopbackProvider(default=Scenario(text="hi")) as server:
        url = f"{server.base_url_openai}/chat/completions?api-version=2024&api-key={SECRET}"
        _post(url, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
        _post(f"{server.url}/nowhere?api-key={SECRET}", {})
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "POST /v1/chat/completions HTTP/1.1" in logged
    assert "POST /nowhere HTTP/1.1" in logged
    assert SECRET not in logged
    assert "api-key" not in logged
