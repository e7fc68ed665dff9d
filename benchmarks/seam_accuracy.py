"""Seam accuracy: what the seam filter wrongly deletes and what repeats it leaves in.

A corpus written for this benchmark (prose, Markdown lists, Python code,
indented JSON, numbers, CJK; see ``benchmarks/_seam_corpus.py``) is cut at
every word end, every word start, inside every word and inside every run of
whitespace. At each cut the caller has seen the prefix; the continuation
request carries it without trailing whitespace, and the provider answers in one
of these ways:

- **exact**: the rest of the uncut text after the stripped prefix (so starting
  with the whitespace the request stripped);
- **N words** (1 to 5): it restarts at the start of the prefix's last N words
  (a cut-off word counts as one) and writes the rest;
- **sentence**: it restarts at the start of the sentence (or line) the cut is in;
- **paragraph 1500+**: it restarts at the start of the paragraph, when that
  repeats 1 500 characters or more.

The continuation is fed to ``SeamFilter`` in pieces of 1, 3, 4 or 7
characters (by case). The output should be the uncut text's rest: characters
missing from it were **wrongly deleted**; a repeat left in front of it counts
when it is two or more words, 12 or more characters, or 4 or more CJK
characters (a single short repeated word may be real text and is kept by
design); those that are one run of a repeated pattern (a rule line of dashes,
"研究研究") are counted apart: the filter keeps them by design, as the text
repeats them for real as often. A second table times a long repeat after a 200 KB prefix, fed one
character at a time.

Run: ``python -m benchmarks.seam_accuracy [--quick]``
"""

from __future__ import annotations

import argparse
import bisect
import re
import sys
import time
import tracemalloc
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from awaken_langchain.seam import SeamFilter
from benchmarks._common import machine_line, table
from benchmarks._seam_corpus import TEXTS, cjk_words

REPEATS = ("exact", *(f"{n} word{'s' if n > 1 else ''}" for n in range(1, 6)), "sentence")
LONG_PARAGRAPH = 1_500
"""Shortest paragraph repeat measured as "paragraph 1500+"."""
TAIL = 48
"""Characters of the text after the repeat that each case feeds."""
PIECES = (1, 3, 4, 7)
SENTENCE_ENDS = (".", "!", "?", ":", "\u3002", "\uff01", "\uff1f")  # and CJK . ! ?


class Filter(Protocol):
    """What the benchmark needs of a seam filter."""

    def feed(self, text: str) -> str:
        """Take continuation text, return what may be released."""

    def flush(self) -> str:
        """Release what is held back."""


@dataclass(frozen=True)
class Case:
    """One cut of one text, continued in one way."""

    kind: str
    repeat: str
    prefix: str
    continuation: str
    expected: str
    """What the caller should receive: the uncut text's rest (its first characters)."""


@dataclass
class Row:
    """The outcome of every case of one kind of text and one kind of continuation."""

    kind: str
    repeat: str
    cases: int = 0
    exact: int = 0
    """Cases whose output was the uncut text's rest, character for character."""
    deleted_chars: int = 0
    """Characters of real text the filter removed."""
    repeats_left: int = 0
    """Cases left with a repeat of two or more words (or 12+ characters)."""
    runs_left: int = 0
    """Cases left with such a repeat that is one run of a repeated pattern (kept by design)."""
    left_chars: int = 0
    """Characters of repeat left in, of any size."""


def is_big_repeat(text: str) -> bool:
    """Whether a repeat left in is one the goals count: 2+ words, 12+ or 4+ CJK characters."""
    words = sum(1 for word in text.split() if any(c.isalnum() for c in word))
    cjk = sum(
        1
        for c in text
        if unicodedata.name(c, "").startswith(("CJK UNIFIED", "HIRAGANA", "KATAKANA"))
    )
    return words >= 2 or len(text.strip()) >= 12 or cjk >= 4


def is_run(text: str) -> bool:
    """Whether ``text`` is one unspaced run of a repeated unit (``"-----"``, ``"研究研究"``)."""
    if not text or any(c.isspace() for c in text):
        return False
    return any(
        text == (text[:unit] * (len(text) // unit + 1))[: len(text)]
        for unit in range(1, len(text) // 2 + 1)
    )


def corpus() -> dict[str, tuple[str, list[tuple[int, int]]]]:
    """Each kind of text with the spans of its words."""
    texts = {
        kind: (text, [m.span() for m in re.finditer(r"\S+", text)]) for kind, text in TEXTS.items()
    }
    texts["cjk"] = cjk_words()
    return texts


def cut_points(text: str, spans: list[tuple[int, int]]) -> list[int]:
    """Every word end and start, every point inside a word or a run of whitespace."""
    cuts: set[int] = set()
    previous_end = 0
    for start, end in spans:
        cuts.update(range(previous_end + 1, start + 1))  # inside whitespace, word start
        cuts.update(range(start + 1, end + 1))  # inside the word, word end
        previous_end = end
    return sorted(c for c in cuts if text[:c].strip() and c < len(text))


@dataclass(frozen=True)
class Starts:
    """Where the words, sentences (or lines) and paragraphs of a text start."""

    words: list[int]
    sentences: list[int]
    paragraphs: list[int]

    @classmethod
    def of(cls, text: str, spans: list[tuple[int, int]]) -> Starts:
        """Find them from the text and its word spans."""
        words = [start for start, _ in spans]
        gaps = {
            start: text[previous:start]
            for (_, previous), (start, _) in zip([(0, 0), *spans], spans, strict=False)
        }
        sentences = [
            s
            for s in words
            if s == 0 or "\n" in gaps[s] or text[: s - len(gaps[s])].endswith(SENTENCE_ENDS)
        ]
        paragraphs = [s for s in words if s == 0 or "\n\n" in gaps[s]]
        return cls(words, sentences, paragraphs)


def restarts(starts: Starts, sent: int) -> Iterator[tuple[str, int]]:
    """Where each kind of provider restarts, for a prefix of ``sent`` characters."""
    yield "exact", sent
    words = bisect.bisect_left(starts.words, sent)
    for count in range(1, 6):
        if count <= words:
            yield REPEATS[count], starts.words[words - count]
    sentence = starts.sentences[bisect.bisect_left(starts.sentences, sent) - 1]
    yield "sentence", sentence
    paragraph = starts.paragraphs[bisect.bisect_left(starts.paragraphs, sent) - 1]
    if sent - paragraph >= LONG_PARAGRAPH:
        yield "paragraph 1500+", paragraph


def cases(every: int = 1) -> Iterator[Case]:
    """Every case of the corpus (every ``every``-th cut point only, for a quick run)."""
    for kind, (text, spans) in corpus().items():
        starts = Starts.of(text, spans)
        for cut in cut_points(text, spans)[::every]:
            prefix = text[:cut]
            sent = len(prefix.rstrip())
            rest = text[cut:]
            for repeat, restart in restarts(starts, sent):
                continuation = text[restart:]
                extra = len(continuation) - len(rest)
                yield Case(kind, repeat, prefix, continuation[: extra + TAIL], rest[:TAIL])


def run_case(case: Case, make_filter: Callable[[str], Filter], piece: int) -> str:
    """Feed the continuation in pieces of ``piece`` characters; return the output."""
    seam = make_filter(case.prefix)
    text = case.continuation
    out = [seam.feed(text[i : i + piece]) for i in range(0, len(text), piece)]
    return "".join(out) + seam.flush()


def measure(make_filter: Callable[[str], Filter] = SeamFilter, every: int = 1) -> list[Row]:
    """Run every case and sum the outcomes per kind of text and of continuation."""
    rows: dict[tuple[str, str], Row] = {}
    for number, case in enumerate(cases(every)):
        row = rows.setdefault((case.kind, case.repeat), Row(case.kind, case.repeat))
        out = run_case(case, make_filter, PIECES[number % len(PIECES)])
        row.cases += 1
        expected = case.expected
        if out == expected:
            row.exact += 1
            continue
        if len(out) <= len(expected) or not out.endswith(expected):
            row.deleted_chars += max(len(expected) - len(out), 1)
            continue
        left = out[: len(out) - len(expected)]
        row.left_chars += len(left)
        if is_big_repeat(left):
            if is_run(left.strip()):
                row.runs_left += 1
            else:
                row.repeats_left += 1
    return list(rows.values())


def totals(rows: list[Row], repeat: str | None = None) -> Row:
    """The sum of ``rows`` (of one kind of continuation, or all)."""
    total = Row("all", repeat or "all")
    for row in rows:
        if repeat is None or row.repeat == repeat:
            total.cases += row.cases
            total.exact += row.exact
            total.deleted_chars += row.deleted_chars
            total.repeats_left += row.repeats_left
            total.runs_left += row.runs_left
            total.left_chars += row.left_chars
    return total


@dataclass
class LongRepeat:
    """Time and memory of one long repeat after a large prefix."""

    case: str
    prefix_chars: int
    repeat_chars: int
    removed: bool
    ms: float
    peak_kb: float


def long_prefix(chars: int) -> str:
    """Prose of about ``chars`` characters in paragraphs of about 2 000 characters."""
    sentences = [
        f"Sentence {n} of the report says that measurement {n * 7 % 1000} was recorded."
        for n in range(chars // 60 + 1)
    ]
    paragraphs = [" ".join(sentences[i : i + 28]) for i in range(0, len(sentences), 28)]
    return "\n\n".join(paragraphs)[:chars].rstrip() + " The end"


def time_long_repeat(
    make_filter: Callable[[str], Filter], prefix_chars: int, repeat_chars: int
) -> LongRepeat:
    """Feed one character at a time a repeat of the prefix's last ``repeat_chars``."""
    prefix = long_prefix(prefix_chars)
    start = prefix.index(" ", len(prefix) - repeat_chars) + 1
    continuation = prefix[start:] + " of it."
    began = time.perf_counter()
    out = _feed_one_by_one(make_filter, prefix, continuation)
    ms = (time.perf_counter() - began) * 1e3
    tracemalloc.start()  # a second run: tracing allocations slows it down
    _feed_one_by_one(make_filter, prefix, continuation)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return LongRepeat(
        f"repeat of the last {repeat_chars:,} chars",
        len(prefix),
        len(continuation) - len(" of it."),
        out == " of it.",
        ms,
        peak / 1024,
    )


def _feed_one_by_one(make_filter: Callable[[str], Filter], prefix: str, text: str) -> str:
    seam = make_filter(prefix)
    return "".join([seam.feed(c) for c in text]) + seam.flush()


def main(
    quick: bool = False, make_filter: Callable[[str], Filter] = SeamFilter
) -> tuple[list[Row], list[LongRepeat]]:
    """Measure, print both tables, return the rows."""
    rows = measure(make_filter, every=7 if quick else 1)
    print(f"## Seam accuracy{' (quick: every 7th cut)' if quick else ''}; {machine_line()}")
    headers = [
        "text",
        "continuation",
        "cases",
        "output == uncut",
        "chars wrongly deleted",
        "repeats left (2+ words/12+ chars)",
        "of which pattern runs",
        "chars of repeat left",
    ]
    order = [*REPEATS, "paragraph 1500+"]
    ordered = sorted(rows, key=lambda r: (r.kind != "prose", r.kind, order.index(r.repeat)))
    summary = [totals(rows, repeat) for repeat in order] + [totals(rows)]
    print(
        table(
            headers,
            [
                (
                    r.kind,
                    r.repeat,
                    r.cases,
                    r.exact,
                    r.deleted_chars,
                    r.repeats_left + r.runs_left,
                    r.runs_left,
                    r.left_chars,
                )
                for r in [*ordered, *(s for s in summary if s.cases)]
            ],
        )
    )
    print()
    sizes = (20_000,) if quick else (200_000,)
    long = [
        time_long_repeat(make_filter, size, repeat)
        for size in sizes
        for repeat in (1_500, 20_000 if quick else 100_000)
    ]
    print("## Long repeats, fed one character at a time")
    print(
        table(
            ["case", "prefix chars", "repeat chars", "removed", "ms", "peak KiB"],
            [
                (
                    r.case,
                    r.prefix_chars,
                    r.repeat_chars,
                    "yes" if r.removed else "no",
                    f"{r.ms:.1f}",
                    f"{r.peak_kb:.0f}",
                )
                for r in long
            ],
        )
    )
    print()
    return rows, long


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every 7th cut: a smoke run")
    main(parser.parse_args().quick)
