"""schema_responder answers the langchain_tests tool and structured-output requests, through
bare ChatOpenAI (Chat Completions and Responses) and ChatAnthropic on the loopback provider."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests.chat_models import (
    _get_joke_class,
    magic_function,
    magic_function_no_args,
)
from pydantic import BaseModel, Field

from awaken_langchain.testing import LoopbackProvider, schema_responder
from awaken_langchain.testing._schema import example_value

MODELS: dict[str, Callable[[LoopbackProvider], BaseChatModel]] = {
    "openai-chat": lambda server: ChatOpenAI(
        model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
    ),
    "openai-responses": lambda server: ChatOpenAI(
        model="gpt-5-mini",
        base_url=server.base_url_openai,
        api_key="x",
        max_retries=0,
        use_responses_api=True,
    ),
    "anthropic": lambda server: ChatAnthropic(  # type: ignore[call-arg]
        model_name="claude-sonnet-4-6",
        base_url=server.base_url_anthropic,
        api_key="x",
        max_retries=0,
    ),
}
SCHEMA_TYPES = ["pydantic", "typeddict", "json_schema"]


class OptionalJoke(BaseModel):
    """Joke to tell user."""

    setup: str = Field(description="question to set up a joke")
    punchline: str | None = Field(default=None, description="answer to resolve the joke")


@pytest.fixture
def server(loopback_provider: LoopbackProvider) -> LoopbackProvider:
    loopback_provider.default = schema_responder()
    return loopback_provider


@pytest.fixture(params=sorted(MODELS))
def model(request: pytest.FixtureRequest, server: LoopbackProvider) -> BaseChatModel:
    return MODELS[request.param](server)


# -- values from schemas ----------------------------------------------------------------


def test_example_values_are_valid_against_their_schemas() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schemas = [
        convert_to_json_schema(_get_joke_class("pydantic")[0]),
        convert_to_json_schema(_get_joke_class("typeddict")[0]),
        convert_to_openai_tool(magic_function)["function"]["parameters"],
        OptionalJoke.model_json_schema(),
        {
            "type": "object",
            "properties": {
                "when": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2},
                "score": {"type": "number", "minimum": 10, "maximum": 20},
                "code": {"type": "string", "minLength": 12, "maxLength": 12},
                "nested": {"$ref": "#/$defs/Inner"},
                "maybe": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
            },
            "required": ["when", "tags", "score", "code", "nested", "maybe"],
            "$defs": {"Inner": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        },
    ]
    for schema in schemas:
        value = example_value(schema)
        jsonschema.validate(value, schema)
        assert value == example_value(schema)  # deterministic


def test_magic_function_gets_the_argument_the_standard_tests_expect() -> None:
    parameters = convert_to_openai_tool(magic_function)["function"]["parameters"]
    assert example_value(parameters) == {"input": 3}


# -- through the bare models ------------------------------------------------------------


@pytest.mark.parametrize("schema_type", SCHEMA_TYPES)
def test_structured_output_parses_on_invoke_and_stream(
    model: BaseChatModel, schema_type: str
) -> None:
    schema, validate = _get_joke_class(schema_type)  # type: ignore[arg-type]
    chat = model.with_structured_output(schema)
    assert validate(chat.invoke("Tell me a joke about cats."))
    chunks = list(chat.stream("Tell me a joke about cats."))
    assert chunks
    assert validate(chunks[-1])


def test_structured_output_with_optional_fields_parses(model: BaseChatModel) -> None:
    result = model.with_structured_output(OptionalJoke).invoke("A joke, no punchline.")
    assert isinstance(result, OptionalJoke)


@pytest.mark.parametrize("provider", ["openai-chat", "openai-responses"])
def test_json_mode_answers_with_the_keys_the_prompt_names(
    server: LoopbackProvider, provider: str
) -> None:
    joke = _get_joke_class("pydantic")[0]
    chat = MODELS[provider](server).with_structured_output(joke, method="json_mode")
    prompt = "Tell me a joke. Return a JSON with 'setup' and 'punchline' keys."
    assert isinstance(chat.invoke(prompt), joke)


def test_bound_tool_is_called_with_schema_arguments(model: BaseChatModel) -> None:
    message = model.bind_tools([magic_function]).invoke("What is the value of magic_function(3)?")
    assert isinstance(message, AIMessage)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("magic_function", {"input": 3})
    ]


def test_forced_tool_without_arguments_is_called_with_none(model: BaseChatModel) -> None:
    bound = model.bind_tools([magic_function, magic_function_no_args], tool_choice="any")
    message = bound.invoke("Call magic_function_no_args.")
    assert isinstance(message, AIMessage)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("magic_function_no_args", {})]


def test_streamed_tool_call_round_trips_to_a_text_answer(model: BaseChatModel) -> None:
    bound = model.bind_tools([magic_function])
    chunks = list(bound.stream("What is magic_function(3)?"))
    first = chunks[0]
    for chunk in chunks[1:]:
        first = first + chunk
    (call,) = first.tool_calls
    assert call["args"] == {"input": 3}
    history = [
        HumanMessage("What is magic_function(3)?"),
        AIMessage(first.content, tool_calls=first.tool_calls),
        ToolMessage("5", tool_call_id=call["id"]),
    ]
    answer = bound.invoke(history)
    assert isinstance(answer, AIMessage)
    assert not answer.tool_calls
    assert answer.text


def test_plain_request_is_echoed(model: BaseChatModel) -> None:
    assert model.invoke("ping").text == "You said: ping"
