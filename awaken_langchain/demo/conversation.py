"""The demo's conversation: the questions, the answers the scripted model knows, the tool."""

from __future__ import annotations

from typing import Any

Q_RATE = "In one paragraph: what does an HTTP 429 from a model provider mean?"
A_RATE = (
    "An HTTP 429 means the provider is rate limiting you: too many requests or tokens "
    "arrived in its accounting window. It usually says how long to wait in a retry-after "
    "header. Nothing was generated yet, so the right move is to wait that long and send "
    "the very same request again."
)
Q_DROP = "Why do streamed answers break, and what should a client do about it?"
A_DROP = (
    "Streamed answers break for ordinary reasons: a provider sheds load, a proxy or load "
    "balancer closes a connection it thinks is idle, a deploy replaces the process that was "
    "reading the stream, or a network path drops packets for a few seconds. A careful client "
    "treats these differently depending on what has already arrived. Before the first token, "
    "it simply retries, honouring any retry hint the provider sent. After partial output, it "
    "keeps what it has shown and asks the model to continue from exactly there, removing any "
    "words the model repeats at the seam. And when the process itself dies, a checkpoint of "
    "the in-flight turn lets a fresh process finish the answer instead of starting over."
)
Q_TOOL = "What will the weather be in Lisbon for the next three days?"
A_TOOL = "Let me look that up with the forecast tool."
TOOL_ARGS: dict[str, Any] = {"city": "Lisbon", "days": 3}
TOOL_RESULT = "Lisbon, next 3 days: sunny, highs of 24 C, a light northerly wind."
A_AFTER_TOOL = (
    f"The forecast tool says: {TOOL_RESULT} Good weather for a walk along the river, "
    "so pack sunglasses rather than an umbrella."
)
Q_REPLACE = "What does a checkpoint of an in-flight turn hold, and what does it leave out?"
A_REPLACE = (
    "A checkpoint of an in-flight turn holds only what a replacement process needs to "
    "finish it: the run and thread it belongs to, the model it was requested from, the text "
    "that has arrived so far across every attempt, the tool calls whose arguments arrived "
    "whole, the one call still arriving, how many retries were spent, and a fencing epoch "
    "so that two processes never write the same turn. It leaves out everything else. The "
    "conversation itself stays in the agent's memory, which remains the authority for "
    "messages, and secrets such as API keys or request headers are never written at all. "
    "When the turn completes and memory has it, the checkpoint is deleted."
)
Q_RESUME = "Why can the Responses API resume a broken stream without generating it again?"
A_RESUME = (
    "A response created in background mode keeps running at the provider when the client's "
    "connection drops, and every event of its stream carries a sequence number. The client "
    "remembers the number of the last event it received and asks for the same stream again, "
    "starting after that event. The provider replays what it already generated and goes on "
    "from there, so nothing is generated twice and nothing is sent twice."
)
Q_LEDGER = "Please add sunglasses to my packing list."
A_LEDGER = "I'll add them with the packing list tool."
LEDGER_ARGS: dict[str, Any] = {"item": "sunglasses"}
LEDGER_RESULT = "Added sunglasses to the packing list."
A_AFTER_LEDGER = "Done: sunglasses are on your packing list, once."
