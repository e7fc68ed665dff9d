"""Instructions one checkpoint costs, early in a turn and far into it, side by side.

A streamed turn is checkpointed every few chunks; each checkpoint captures the
turn (`TurnAccumulator.capture`) and hands it to the store's writer, which
writes it. That work must not grow with the answer: a checkpoint 200 KB into
a turn should cost what one 2 KB into it costs (the goal: within 10 %).

Each case runs in its own process under valgrind (cachegrind): the turn is
streamed to ``chars`` characters in ``"word "`` chunks, as a provider
streams it, then 30 characters at a time (six more chunks)
for ``steps`` steps, taking a checkpoint at each of the first ``snapshots``
steps. Two processes per case take ``few`` and ``many`` checkpoints over the
same chunks; the difference in instructions, divided by the difference in
checkpoints, is what one checkpoint costs (capture, the writer's commit and
the store's put), with the chunks, the interpreter's start-up and the turn's
first write taken out. The garbage collector is off during the steps and
string hashing is seeded, so the counts repeat to the instruction.

Needs ``valgrind`` on the ``PATH`` (Debian: ``apt-get install valgrind``).

Run: ``python -m benchmarks.snapshot_instructions [--short 2000] [--long 200000]
[--few 20] [--many 60] [--store memory diskcache file]``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (
    CACHEGRIND,
    child_env,
    counted_instructions,
    machine_line,
    require_valgrind,
    run_child,
    table,
)

STORES = ("memory", "diskcache", "file")
GOAL = 1.10
"""Most a checkpoint far into a turn may cost, as a multiple of one early in it."""

_CHILD = """
import gc, json, shutil, tempfile
from pathlib import Path
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk
from awaken_langchain import (
    DiskCacheStreamCheckpointStore, FileStreamCheckpointStore, InMemoryStreamCheckpointStore,
)
from awaken_langchain.accumulator import TurnAccumulator
from awaken_langchain.writer import CheckpointWriter

kind, chars, steps, snapshots = ARGS
directory = Path(tempfile.mkdtemp(prefix="snapshot-instructions-"))
if kind == "memory":
    store = InMemoryStreamCheckpointStore()
elif kind == "diskcache":
    store = DiskCacheStreamCheckpointStore(directory)
else:
    store = FileStreamCheckpointStore(directory)
writer = CheckpointWriter(store)
epoch = store.claim("turn")
fields = {
    "provider_response_id": None, "provider_sequence_number": None, "run_id": "turn",
    "thread_id": None, "model": "openai-chat:gpt-4o-mini", "model_spans": (),
    "fingerprint": "f" * 64, "retry_count": 0, "epoch": epoch, "complete": False,
    "keep_for": None,
}
acc = TurnAccumulator("message")
acc.begin_attempt(continuing=False)
def chunk(text):
    return ChatGenerationChunk(message=AIMessageChunk(content=text))
written = 0
while written < chars:
    acc.feed(chunk("word "))
    written += 5
writer._commit([acc.capture(**fields)])  # the turn's first write: a whole record
gc.collect()
gc.disable()
for step in range(steps):
    for _ in range(6):
        acc.feed(chunk("word "))
    if step < snapshots:
        writer._commit([acc.capture(**fields)])
stored = store.get("turn")
assert stored is not None and stored.partial_text == acc.text[: len(stored.partial_text)]
store.close()
shutil.rmtree(directory, ignore_errors=True)
print(json.dumps({"chars": len(stored.partial_text)}))
"""


def check(stores: tuple[str, ...] = STORES) -> None:
    """Run each store's case once in this process, not counted: what ``--quick`` runs.

    The case checks that the store holds the turn's text.
    """
    for store in stores:
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # our own code, without valgrind
                exec(_CHILD, {"ARGS": [store, 2_000, 4, 2]})
        finally:
            gc.enable()  # the case turns the collector off
    print(
        "instructions per checkpoint: not counted in a quick run; each store held the "
        "turn's text after its checkpoints"
    )


@dataclass
class Row:
    """What one checkpoint costs in one store, early and far into a turn."""

    store: str
    short: float
    long: float

    @property
    def ratio(self) -> float:
        return self.long / self.short

    @property
    def met(self) -> str:
        return "yes" if self.ratio <= GOAL else "no"


def per_checkpoint(store: str, chars: int, few: int, many: int) -> float:
    """Marginal instructions per checkpoint ``chars`` characters into a turn."""
    counts = []
    for snapshots in (few, many):
        code = f"ARGS = {json.dumps([store, chars, many, snapshots])}\n{_CHILD}"
        _, stderr = run_child(
            code,
            what=f"{store} at {chars} chars",
            under=CACHEGRIND,
            env={**child_env(), "PYTHONHASHSEED": "0"},
        )
        counts.append(counted_instructions(stderr, f"{store} at {chars} chars"))
    return (counts[1] - counts[0]) / (many - few)


def main(
    short: int = 2_000,
    long: int = 200_000,
    few: int = 20,
    many: int = 60,
    stores: tuple[str, ...] = STORES,
) -> list[Row]:
    """Measure and print instructions per checkpoint at ``short`` and ``long`` characters."""
    require_valgrind()
    rows = [
        Row(store, per_checkpoint(store, short, few, many), per_checkpoint(store, long, few, many))
        for store in stores
    ]
    print(
        f"Instructions per checkpoint (capture, writer commit, store put; 30 characters "
        f"apart), {short:,} vs {long:,} characters into a turn; goal <= {GOAL:.2f}x"
    )
    print(machine_line())
    print(
        table(
            ["store", f"at {short:,} chars", f"at {long:,} chars", "ratio", "goal met"],
            [[r.store, f"{r.short:,.0f}", f"{r.long:,.0f}", f"{r.ratio:.3f}", r.met] for r in rows],
        )
    )
    print(json.dumps({r.store: {"short": r.short, "long": r.long} for r in rows}))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=2_000, help="characters early in a turn")
    parser.add_argument("--long", type=int, default=200_000, help="characters far into a turn")
    parser.add_argument("--few", type=int, default=20, help="checkpoints in the first process")
    parser.add_argument("--many", type=int, default=60, help="checkpoints in the second process")
    parser.add_argument("--store", nargs="+", choices=STORES, default=list(STORES))
    args = parser.parse_args()
    main(args.short, args.long, args.few, args.many, tuple(args.store))
