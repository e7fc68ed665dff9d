"""The example chat app (``python -m awaken_langchain.examples.chat``), without a browser."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import pytest

from awaken_langchain.examples.chat import (
    build_agent,
    build_app,
    loopback_provider,
    main,
    scripted_answer,
)
from awaken_langchain.testing import Scenario


def test_the_one_command_serves_the_page_and_streams_an_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--smoke", "--port", "0", "--delay", "0", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == scripted_answer("Hello?") + "\n"
    assert (tmp_path / "memory.sqlite").stat().st_mode & 0o777 == 0o600


def test_ask_rejects_bad_requests_and_a_second_question_while_one_is_answered(
    tmp_path: Path,
) -> None:
    with loopback_provider(delay=0) as provider:
        provider.enqueue(Scenario(text="slow " * 200, chunk_size=5, delay=0.01))
        agent = build_agent(tmp_path, provider.base_url_openai)

        async def call() -> list[int]:
            transport = httpx.ASGITransport(app=build_app(agent))
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                page = await client.get("/")
                assert "new EventSource(" in page.text
                conversation = str(uuid.uuid4())
                statuses = [
                    (await client.post("/ask", content=b"not json")).status_code,
                    (await client.post("/ask", json={"question": "Hi"})).status_code,
                    (
                        await client.post("/ask", json={"question": "", "conversation": "c"})
                    ).status_code,
                    (
                        await client.post("/ask", json={"question": "Hi", "conversation": 7})
                    ).status_code,
                ]
                asked = {"question": "Hi", "conversation": conversation}
                first = await client.post("/ask", json=asked)
                statuses += [first.status_code, (await client.post("/ask", json=asked)).status_code]
                run_id = first.json()["run_id"]
                statuses.append((await client.post(f"/api/runs/{run_id}/stop")).status_code)
                return statuses

        try:
            assert asyncio.run(call()) == [400, 400, 400, 400, 201, 409, 202]
            deadline = time.monotonic() + 10
            while agent.busy:  # the stopped turn ends
                assert time.monotonic() < deadline
                time.sleep(0.01)
        finally:
            agent.close()
