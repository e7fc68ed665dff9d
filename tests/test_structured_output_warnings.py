"""Structured output through the wrapper is as quiet as the bare model, and the same answer.

Warnings are errors here: the wrapper streams every call, and langchain-openai's
streamed structured output made pydantic warn about ``parsed`` where the bare
model's ``invoke`` does not.
"""

from __future__ import annotations

import warnings

import pytest
from pydantic import BaseModel

from awaken_langchain import RecoveringChatModel
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario, schema_responder
from tests.conftest import Drive, loopback_client

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("error::UserWarning"),
]


class Forecast(BaseModel):
    city: str
    temperature: float


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = schema_responder()
    return shared_server


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_structured_output_through_the_wrapper_warns_no_more_than_the_bare_model(
    server: LoopbackProvider, drive: Drive, provider: str, method: str
) -> None:
    if provider == "anthropic" and method == "json_mode":
        pytest.skip("ChatAnthropic has no JSON mode")
    bare = loopback_client(provider, server)
    wrapped = RecoveringChatModel(model=bare)
    prompt = "The forecast for Paris, as JSON with city and temperature"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        expected = await drive.invoke(
            bare.with_structured_output(Forecast, method=method, include_raw=True), prompt
        )
    bare_warnings = [str(w.message) for w in seen]

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = await drive.invoke(
            wrapped.with_structured_output(Forecast, method=method, include_raw=True), prompt
        )

    assert [str(w.message) for w in seen] == bare_warnings
    assert result["parsed"] == expected["parsed"]
    assert isinstance(result["parsed"], Forecast) or method == "json_mode"
    parsed = result["raw"].additional_kwargs.get("parsed")
    assert parsed == expected["raw"].additional_kwargs.get("parsed")
    streaming = ("stream", "stream_options")  # the wrapper streams; the bare invoke does not
    bare_sent, sent = (
        {k: v for k, v in r.body.items() if k not in streaming} for r in server.requests[-2:]
    )
    assert sent == bare_sent  # the same schema, written the same way


async def test_a_structured_answer_cut_short_is_asked_again_and_parsed_whole(
    server: LoopbackProvider, drive: Drive
) -> None:
    schema = {"city": "Paris", "temperature": 21.5}
    answer = '{"city":"Paris","temperature":21.5}'
    server.enqueue(
        Scenario(text=answer, chunk_size=4, fault=Fault.drop_after_events(5)),
        Scenario(text=answer, chunk_size=4),
    )
    wrapped = RecoveringChatModel(model=loopback_client("openai", server))
    result = await drive.invoke(
        wrapped.with_structured_output(Forecast, include_raw=True), "Paris forecast"
    )

    assert result["parsed"] == Forecast(**schema)
    assert result["raw"].additional_kwargs["parsed"] == Forecast(**schema)
    assert len(server.requests) == 2
