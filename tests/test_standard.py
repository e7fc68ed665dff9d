"""langchain-tests' standard suites: the wrapper is a standard LangChain chat model.

The unit suite wraps ChatOpenAI; the integration suite wraps ChatOpenAI pointed at
the loopback provider, so it runs offline (capabilities that depend on a real
model's judgement, such as choosing a tool, are switched off).
"""

from __future__ import annotations

import atexit
from typing import Any

import pytest
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from awaken_langchain import RecoveringChatModel
from awaken_langchain.testing import LoopbackProvider, echo_responder

# langchain-openai caches its async HTTP client per base URL: share one event loop
pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings(
        "ignore:The test <Function .* is marked with '@pytest.mark.asyncio'"
    ),
]

_SERVER: LoopbackProvider | None = None


def _server() -> LoopbackProvider:
    global _SERVER
    if _SERVER is None:
        _SERVER = LoopbackProvider(default=echo_responder()).start()
        atexit.register(_SERVER.stop)
    return _SERVER


class TestRecoveringChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[RecoveringChatModel]:
        return RecoveringChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": ChatOpenAI(model="gpt-4o-mini", api_key="test")}  # type: ignore[arg-type]


class TestRecoveringChatModelIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[RecoveringChatModel]:
        return RecoveringChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        inner = ChatOpenAI(
            model="gpt-4o-mini",
            base_url=_server().base_url_openai,
            api_key="x",  # type: ignore[arg-type]
            max_retries=0,
            stream_usage=True,
        )
        return {"model": inner}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True
