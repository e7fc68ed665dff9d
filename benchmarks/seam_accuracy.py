"""Seam accuracy: what the seam filter wrongly deletes and what repeats it leaves in.

Texts: a corpus written for this benchmark (prose, Markdown lists, Python code,
indented JSON, numbers, CJK, and texts that repeat words, lines and table cells
for real; see ``benchmarks/_seam_corpus.py``), the text of the recorded real
provider streams in ``../shared/realwire/`` (read at run time, when that
directory is there; ``--realwire DIR`` or ``AWAKEN_REALWIRE`` names another;
without it the corpus alone is cut, with a note), and, for natural cuts only,
this repository's README and documentation pages (``docs/*.md``).

Each text is cut at every point (every word end and start, inside every word
and every run of whitespace). At each cut the caller has seen the prefix; the
continuation request carries it without trailing whitespace, and the provider
answers in one of these ways (a family of continuations):

- **natural**: the rest of the uncut text after the stripped prefix (starting
  with the whitespace the request stripped): the text a continuation must not
  lose a character of;
- **glued N words** (1 to 5): it restarts at the start of the prefix's last N
  words (a cut-off word counts as one), joined to the prefix without a space;
- **spaced N words** (1 to 12): the same, from the space before those words,
  as tokens that carry their leading space do (``" over the lazy dog."``);
- **sentence glued / spaced**: it restarts at the start of the sentence;
- **line from its break / with its indentation / from the space before its
  first word / from its first word**: it restarts the line the cut is in
  (Markdown items, headings, code, JSON lines); the third is the token that
  carries the indentation's last space and the line's first word;
- **bracket glued / spaced**: cut right after an opening bracket or quote, it
  restarts at the last word with a letter or digit (``"green ("`` +
  ``"green (lime green)"``);
- **paragraph 1500+**: it restarts at the start of the paragraph, when that
  repeats 1 500 characters or more.

The continuation is fed to the filter in pieces of 1, 3, 4 or 7 characters (by
case). The output should be the uncut text's rest. Characters missing from it
were **wrongly deleted**; text left in front of it is a repeat **left in**. A
repeat left in is counted as kept by design, by class, when it is one a text
may hold for real (see :func:`kept_by_design`): one run of a repeated pattern,
text the prefix already holds right before it, a repeat that begins with a line
break, a table cell, a single word after a space, a single letter, a single
word without a letter (a number, a mark), fewer than 4 CJK characters.

The ambiguity table takes each class the other way: a filter that also
removes the class, run over the natural cuts, shows what that would wrongly
delete from each group of texts (the written corpus, the real streams, the
project docs, and apart the two texts written to repeat things for real), with
a few of the cuts.

A last table times a long repeat after a 200 KB prefix, fed one character at
a time.

Run: ``python -m benchmarks.seam_accuracy [--quick] [--realwire DIR]``
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import sys
import time
import tracemalloc
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from awaken_langchain.seam import SeamFilter, is_repeat_start
from benchmarks._common import REPO_ROOT, machine_line, table
from benchmarks._seam_corpus import TEXTS, cjk_words

GLUED = tuple(f"glued {n} word{'s' if n > 1 else ''}" for n in range(1, 6))
SPACED = tuple(f"spaced {n} word{'s' if n > 1 else ''}" for n in range(1, 13))
FAMILIES = (
    "natural",
    *GLUED,
    *SPACED,
    "sentence glued",
    "sentence spaced",
    "line from its break",
    "line with its indentation",
    "line from the space before its first word",
    "line from its first word",
    "bracket glued",
    "bracket spaced",
    "paragraph 1500+",
)
LONG_PARAGRAPH = 1_500
"""Shortest paragraph repeat measured as "paragraph 1500+"."""
TAIL = 48
"""Characters of the text after the repeat that each case feeds."""
PIECES = (1, 3, 4, 7)
SENTENCE_ENDS = (".", "!", "?", ":", "\u3002", "\uff01", "\uff1f")  # and CJK . ! ?
OPENERS = "([{\"'`<\u201c\u2018\u00ab"
"""Opening brackets and quotes (a straight quote opens after a space or a bracket)."""
REALWIRE = Path(os.environ.get("AWAKEN_REALWIRE", REPO_ROOT.parent / "shared" / "realwire"))
"""The recorded real provider streams (not part of this repository)."""
NATURAL_ONLY = "project docs"
"""The kind of text cut for natural continuations only: the README and the docs pages."""
QUICK_README = 8
"""A quick run cuts the project's docs 8 times more sparsely than the other texts."""
AMBIGUOUS = "squares"
"""The kind of text whose natural cuts are the glued ambiguity, reported apart."""


class Filter(Protocol):
    """What the benchmark needs of a seam filter."""

    def feed(self, text: str) -> str:
        """Take continuation text, return what may be released."""

    def flush(self) -> str:
        """Release what is held back."""


@dataclass(frozen=True)
class Text:
    """One text to cut, with the spans of its words."""

    kind: str
    name: str
    text: str
    spans: list[tuple[int, int]]


@dataclass(frozen=True)
class Case:
    """One cut of one text, continued in one way."""

    kind: str
    family: str
    prefix: str
    continuation: str
    expected: str
    """What the caller should receive: the uncut text's rest (its first characters)."""
    by_design: str
    """Why the repeat is one the text repeats for real as often ("": it is not)."""


@dataclass
class Row:
    """The outcome of every case of one kind of text and one family of continuations."""

    kind: str
    repeat: str
    cases: int = 0
    exact: int = 0
    """Cases whose output was the uncut text's rest, character for character."""
    deleted_chars: int = 0
    """Characters of real text the filter removed."""
    repeats_left: int = 0
    """Cases left with a repeat that is not kept by design."""
    runs_left: int = 0
    """Cases left with a repeat kept by design (see the module docstring)."""
    left_chars: int = 0
    """Characters of repeat left in, of any kind."""
    sample: list[str] = field(default_factory=list)
    """A few repeats left in that are not kept by design, to show."""
    reasons: dict[str, int] = field(default_factory=dict)
    """Repeats left in and kept by design, by reason."""
    deletions: list[str] = field(default_factory=list)
    """A few cases that lost real text, to show (prefix's end | continuation -> output)."""
    deleting_cases: int = 0
    """Cases that lost real text."""

    @property
    def removed_pct(self) -> float:
        """Repeats removed, in % of those not kept by design (100 for none)."""
        wanted = self.cases - self.runs_left
        return 100.0 * self.exact / wanted if wanted else 100.0


def is_run(text: str) -> bool:
    """Whether ``text`` is one run of a repeated unit (``"-----"``, ``"ha ha"``, ``"| 0 | 0"``)."""
    size = len(text)
    return size > 1 and any(
        text[unit:] == text[:-unit] for unit in range(1, size // 2 + 1) if text[unit] == text[0]
    )


def cjk_chars(text: str) -> int:
    """How many CJK characters ``text`` holds."""
    return sum(
        1
        for c in text
        if unicodedata.name(c, "").startswith(("CJK UNIFIED", "HIRAGANA", "KATAKANA"))
    )


REASONS = (
    "run",
    "already there",
    "line break",
    "table cell",
    "spaced word",
    "indented spaced word",
    "single letter",
    "number",
    "mark",
    "short CJK",
)
"""Why a repeat is kept by design, in the order they are checked (see :func:`kept_by_design`)."""


BOUNDS = ("", " ", "\n")
"""What may come before a word."""


def kept_by_design(text: str, restart: int, repeat: str, after: str = "") -> str:
    """Why ``repeat``, restarted at ``restart`` of ``text``, is kept by design ("": it is not).

    ``after`` is the character that follows the repeat in the continuation.

    That is, the class of repeats it belongs to that a text may hold for real:

    - ``"run"``: one run of a repeated pattern (``"-----"``, ``"| 0 | 0"``);
    - ``"already there"``: what the prefix already holds right before it
      (``"that"`` + ``" that"``);
    - ``"line break"``: a repeat that begins with a line break, a whole line
      again as refrains and table rows are;
    - ``"table cell"``: a repeat in a table row that is not the whole row;
    - ``"spaced word"``: a single word after a space (``"had"`` + ``" had"``);
    - ``"indented spaced word"``: the same at a line's start, after the last
      space of its indentation or an indentation of one character;
    - ``"single letter"``: one letter, glued or after a line's indentation, but
      for a capital followed by a lowercase letter or an apostrophe (``"T"`` +
      ``"The"``);
    - ``"number"``: one word with a digit and no letter, glued (``"1."``, ``"2024"``);
    - ``"mark"``: one word without a letter or digit, glued (``"-"``, ``"**"``);
    - ``"short CJK"``: fewer than 4 CJK characters.
    """
    body = repeat.strip()
    lead = repeat[: len(repeat) - len(repeat.lstrip())]
    if not body or is_run(body):
        return "run"
    before = text[:restart].rstrip()
    spaced = lead and "\n" not in lead and (restart == 0 or text[restart - 1] != "\n")
    if spaced and before.endswith(body) and before[: len(before) - len(body)][-1:] in BOUNDS:
        return "already there"
    first_line, _, _ = body.partition("\n")
    if "\n" in lead or ("\n" in body and not re.search(r"\w", first_line)):
        return "line break"
    end = restart + len(repeat)
    line = text.rfind("\n", 0, end) + 1
    row = line + len(text[line:end]) - len(text[line:end].lstrip())
    if text[row] == "|" and restart + len(lead) > row:
        return "table cell"
    indented = restart > 0 and text[restart - 1] == "\n" and len(lead) >= 2
    if lead and not indented and len(body.split()) < 2:
        in_indentation = restart > 0 and text[:restart].rstrip(" \t").endswith("\n")
        return "indented spaced word" if in_indentation else "spaced word"
    named = sum(1 for word in body.split() if any(c.isalnum() for c in word))
    if named >= 2:
        return ""
    if cjk_chars(body):
        return "short CJK" if cjk_chars(body) < 4 else ""
    letters = sum(1 for c in body if c.isalpha())
    if letters and len(body) < 2:
        capital = body.isupper() and not lead and (after.islower() or after in "'\u2019")
        return "" if capital and after else "single letter"
    if not letters:
        return "number" if any(c.isdigit() for c in body) else "mark"
    return ""


def removing(reason: str) -> Callable[[str], Filter]:
    """A seam filter that also removes the repeats kept by design for ``reason``.

    The benchmark measures the other side of each class with it: what removing
    that class would wrongly delete from natural text.
    """

    class Removing(SeamFilter):
        def _is_removable(self, index: int, after: str = "") -> bool:
            text = self._text
            return super()._is_removable(index, after) or (
                is_repeat_start(text, index) and kept_by_design(text, index, text[index:]) == reason
            )

        def _last_removable_start(self) -> int:
            return len(self._text) - 1  # no bound: the class may be one character

    Removing.__name__ = f"Removing {reason}"
    return Removing


def word_spans(text: str) -> list[tuple[int, int]]:
    """The spans of the whitespace-separated words of ``text``."""
    return [m.span() for m in re.finditer(r"\S+", text)]


def realwire_texts(directory: Path) -> list[Text]:
    """The answer text of each recorded stream in ``directory`` (none when it is absent)."""
    texts = []
    for path in sorted(directory.glob("*.sse")) if directory.is_dir() else []:
        deltas = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("data:"):
                continue
            try:
                event = json.loads(line[5:])
            except ValueError:
                continue
            delta = event.get("delta") if isinstance(event, dict) else None
            if isinstance(delta, dict) and delta.get("type") == "text_delta":
                deltas.append(delta.get("text", ""))
            for choice in event.get("choices") or [] if isinstance(event, dict) else []:
                content = (choice.get("delta") or {}).get("content")
                if isinstance(content, str):
                    deltas.append(content)
        text = "".join(deltas)
        if text.strip():
            texts.append(Text("realwire", path.stem, text, word_spans(text)))
    return texts


def corpus(realwire: Path | None = REALWIRE) -> list[Text]:
    """Every text to cut: the written corpus, the real streams, the README and docs."""
    texts = [Text(kind, kind, text, word_spans(text)) for kind, text in TEXTS.items()]
    texts.append(Text("cjk", "cjk", *cjk_words()))
    if realwire is not None:
        texts += realwire_texts(realwire)
    for page in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        if page.is_file():
            text = page.read_text(encoding="utf-8")
            name = str(page.relative_to(REPO_ROOT))
            texts.append(Text(NATURAL_ONLY, name, text, word_spans(text)))
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
    """Where the words, sentences and paragraphs of a text start."""

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
            if s == words[0] or "\n" in gaps[s] or text[: s - len(gaps[s])].endswith(SENTENCE_ENDS)
        ]
        paragraphs = [s for s in words if s == words[0] or "\n\n" in gaps[s]]
        return cls(words, sentences, paragraphs)


def spaced(text: str, start: int) -> int | None:
    """Where a restart at word ``start`` begins with the space before it (None: a line break).

    At the very start of the text, a provider's first token carries a space
    the text does not have: -1 stands for it.
    """
    if start == 0:
        return -1
    before = start
    while before > 0 and text[before - 1].isspace():
        before -= 1
    gap = text[before:start]
    return None if not gap or "\n" in gap else before


def is_opener(text: str, index: int) -> bool:
    """Whether ``text[index]`` opens a bracket or a quote (a straight quote after a space)."""
    char = text[index]
    if char not in OPENERS:
        return False
    return char not in "\"'`" or index == 0 or text[index - 1].isspace() or text[index - 1] in "([{"


def restarts(text: str, starts: Starts, sent: int) -> Iterator[tuple[str, int]]:
    """Where each family of provider restarts, for a prefix of ``sent`` characters.

    -1 stands for a space before the text (see :func:`spaced`).
    """
    yield "natural", sent
    words = bisect.bisect_left(starts.words, sent)
    for count in range(1, 13):
        if count > words:
            break
        start = starts.words[words - count]
        if count <= len(GLUED):
            yield GLUED[count - 1], start
        space = spaced(text, start)
        if space is not None:
            yield SPACED[count - 1], space
    sentence = starts.sentences[bisect.bisect_left(starts.sentences, sent) - 1]
    yield "sentence glued", sentence
    space = spaced(text, sentence)
    if space is not None:
        yield "sentence spaced", space
    line = text.rfind("\n", 0, sent) + 1
    if line:
        yield "line from its break", line - 1
        first = len(text) - len(text[line:].lstrip())
        if first > line:
            yield "line with its indentation", line
        if first - line >= 2 and text[first - 1] == " ":
            yield "line from the space before its first word", first - 1
        yield "line from its first word", first
    if is_opener(text, sent - 1):
        named = [s for s in starts.words[:words] if re.search(r"\w", text[s:sent])]
        if named:
            yield "bracket glued", named[-1]
            space = spaced(text, named[-1])
            if space is not None:
                yield "bracket spaced", space
    paragraph = starts.paragraphs[bisect.bisect_left(starts.paragraphs, sent) - 1]
    if sent - paragraph >= LONG_PARAGRAPH:
        yield "paragraph 1500+", paragraph


def cases(texts: list[Text], every: int = 1) -> Iterator[Case]:
    """Every case of ``texts`` (every ``every``-th cut point only, for a quick run)."""
    for item in texts:
        text = item.text
        starts = Starts.of(text, item.spans)
        step = every * (QUICK_README if every > 1 and item.kind == NATURAL_ONLY else 1)
        for cut in cut_points(text, item.spans)[::step]:
            prefix = text[:cut]
            sent = len(prefix.rstrip())
            rest = text[cut:]
            found = restarts(text, starts, sent)
            for family, restart in found if item.kind != NATURAL_ONLY else [next(found)]:
                continuation = " " + text if restart < 0 else text[restart:]
                repeat = continuation[: len(continuation) - len(text) + sent]
                extra = len(continuation) - len(rest)
                yield Case(
                    item.kind,
                    family,
                    prefix,
                    continuation[: extra + TAIL],
                    rest[:TAIL],
                    ""
                    if family == "natural"
                    else kept_by_design(
                        text, max(restart, 0), repeat, continuation[len(repeat) : len(repeat) + 1]
                    ),
                )


def run_case(case: Case, make_filter: Callable[[str], Filter], piece: int) -> str:
    """Feed the continuation in pieces of ``piece`` characters; return the output."""
    seam = make_filter(case.prefix)
    text = case.continuation
    out = [seam.feed(text[i : i + piece]) for i in range(0, len(text), piece)]
    return "".join(out) + seam.flush()


def measure(
    make_filter: Callable[[str], Filter] = SeamFilter,
    every: int = 1,
    texts: list[Text] | None = None,
    families: set[str] | None = None,
) -> list[Row]:
    """Run every case (of ``families``) and sum the outcomes per kind of text and family."""
    rows: dict[tuple[str, str], Row] = {}
    for number, case in enumerate(cases(corpus() if texts is None else texts, every)):
        if families is not None and case.family not in families:
            continue
        row = rows.setdefault((case.kind, case.family), Row(case.kind, case.family))
        out = run_case(case, make_filter, PIECES[number % len(PIECES)])
        row.cases += 1
        expected = case.expected
        if out == expected:
            row.exact += 1
            continue
        if len(out) <= len(expected) or not out.endswith(expected):
            row.deleted_chars += max(len(expected) - len(out), 1)
            row.deleting_cases += 1
            if len(row.deletions) < 3:
                shown = f"{case.prefix[-24:]!r} | {case.continuation[:16]!r} -> {out[:16]!r}"
                row.deletions.append(shown)
            continue
        left = out[: len(out) - len(expected)]
        row.left_chars += len(left)
        if case.by_design:
            row.runs_left += 1
            row.reasons[case.by_design] = row.reasons.get(case.by_design, 0) + 1
        else:
            row.repeats_left += 1
            if len(row.sample) < 3:
                row.sample.append(case.prefix[-30:] + " + " + case.continuation[:40])
    return list(rows.values())


def totals(rows: list[Row], repeat: str | None = None, kinds: set[str] | None = None) -> Row:
    """The sum of ``rows`` (of one family, of some kinds of text, or all)."""
    total = Row("all", repeat or "all")
    for row in rows:
        if (repeat is None or row.repeat == repeat) and (kinds is None or row.kind in kinds):
            total.cases += row.cases
            total.exact += row.exact
            total.deleted_chars += row.deleted_chars
            total.repeats_left += row.repeats_left
            total.runs_left += row.runs_left
            total.left_chars += row.left_chars
            total.sample += row.sample[: 3 - len(total.sample)]
            total.deleting_cases += row.deleting_cases
            total.deletions += row.deletions[: 3 - len(total.deletions)]
            for reason, count in row.reasons.items():
                total.reasons[reason] = total.reasons.get(reason, 0) + count
    return total


def kinds_of(rows: list[Row]) -> set[str]:
    """The kinds of text the goal counts (all but the glued ambiguity's)."""
    return {r.kind for r in rows} - {AMBIGUOUS}


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
    make_filter: Callable[[str], Filter], prefix_chars: int, repeat_chars: int, lead: str = ""
) -> LongRepeat:
    """Feed one character at a time a repeat of the prefix's last ``repeat_chars``.

    ``lead`` is " " for a repeat that starts with the space before its first word.
    """
    prefix = long_prefix(prefix_chars)
    start = prefix.index(" ", len(prefix) - repeat_chars) + 1 - len(lead)
    continuation = prefix[start:] + " of it."
    began = time.perf_counter()
    out = _feed_one_by_one(make_filter, prefix, continuation)
    ms = (time.perf_counter() - began) * 1e3
    tracemalloc.start()  # a second run: tracing allocations slows it down
    _feed_one_by_one(make_filter, prefix, continuation)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return LongRepeat(
        f"{'spaced' if lead else 'glued'} repeat of the last {repeat_chars:,} chars",
        len(prefix),
        len(continuation) - len(" of it."),
        out == " of it.",
        ms,
        peak / 1024,
    )


def _feed_one_by_one(make_filter: Callable[[str], Filter], prefix: str, text: str) -> str:
    seam = make_filter(prefix)
    return "".join([seam.feed(c) for c in text]) + seam.flush()


def _print_families(rows: list[Row]) -> None:
    kinds = kinds_of(rows)
    headers = [
        "continuation",
        "cases",
        "output == uncut",
        "removed % of all",
        "removed % of removable",
        "left: other",
        "chars wrongly deleted",
        *(f"kept: {reason}" for reason in REASONS),
    ]
    body = []
    for family in FAMILIES:
        r = totals(rows, family, kinds)
        if not r.cases:
            continue
        natural = family == "natural"
        body.append(
            (
                family,
                r.cases,
                r.exact,
                "-" if natural else f"{100.0 * r.exact / r.cases:.1f}",
                "-" if natural else f"{r.removed_pct:.2f}",
                r.repeats_left,
                r.deleted_chars,
                *(r.reasons.get(reason, 0) for reason in REASONS),
            )
        )
    print(table(headers, body))
    samples = [s for family in FAMILIES for s in totals(rows, family, kinds).sample[:1]]
    if samples:
        print("\nrepeats left in (not by design), first of each family:")
        print("\n".join(f"  {s!r}" for s in samples))


def _print_natural(rows: list[Row]) -> None:
    headers = ["text", "natural cuts", "output == uncut", "chars wrongly deleted"]
    natural = sorted((r for r in rows if r.repeat == "natural"), key=lambda r: r.kind)
    total = totals(rows, "natural", kinds_of(rows))
    print(
        table(
            headers,
            [(r.kind, r.cases, r.exact, r.deleted_chars) for r in natural]
            + [("all but squares", total.cases, total.exact, total.deleted_chars)],
        )
    )


WRITTEN = ("prose", "markdown", "python", "json", "numbers", "cjk")
"""The corpus texts written as a model might write (not to repeat things for real)."""


@dataclass
class OtherSide:
    """One class of repeats kept by design, and what removing it instead does."""

    reason: str
    kept: int
    """Repeats of the class the rule leaves in (all families)."""
    repeats: int
    """Repeats of every family (the share of the class is of these)."""
    removed: int
    """Of ``kept``, how many a filter that removes the class removes."""
    natural: dict[str, Row]
    """Natural cuts with that filter, by group of texts."""


def other_sides(rows: list[Row], every: int, texts: list[Text]) -> list[OtherSide]:
    """For each class kept by design, measure a filter that removes it instead."""
    kinds = kinds_of(rows)
    repeats = sum(r.cases for r in rows if r.repeat != "natural" and r.kind in kinds)
    groups = {
        "written corpus": set(WRITTEN),
        "realwire": {"realwire"},
        "project docs": {NATURAL_ONLY},
        "doubled": {"doubled"},
        AMBIGUOUS: {AMBIGUOUS},
    }
    sides = []
    for reason in REASONS:
        kept = sum(r.reasons.get(reason, 0) for r in rows if r.kind in kinds)
        if not kept:
            continue
        families = {"natural"} | {r.repeat for r in rows if r.reasons.get(reason)}
        measured = measure(removing(reason), every, texts, families)
        left = sum(r.reasons.get(reason, 0) for r in measured if r.kind in kinds)
        natural = {name: totals(measured, "natural", group) for name, group in groups.items()}
        sides.append(OtherSide(reason, kept, repeats, kept - left, natural))
    return sides


def _print_ambiguities(sides: list[OtherSide]) -> None:
    groups = list(sides[0].natural) if sides else []
    headers = [
        "class kept by design",
        "repeats kept",
        "% of all repeats",
        "removed % if removed",
        *(f"deleted chars (cuts): {group}" for group in groups),
    ]
    body = [
        (
            side.reason,
            side.kept,
            f"{100.0 * side.kept / side.repeats:.2f}",
            f"{100.0 * side.removed / side.kept:.1f}",
            *(f"{row.deleted_chars} ({row.deleting_cases})" for row in side.natural.values()),
        )
        for side in sides
    ]
    print(table(headers, body))
    for side in sides:
        natural = [row for name, row in side.natural.items() if name != AMBIGUOUS]
        shown = [e for row in natural for e in row.deletions][:4]
        if shown:
            print(f"\nremoving {side.reason!r} would delete, e.g.:")
            print("\n".join(f"  {e}" for e in shown))


def main(
    quick: bool = False,
    make_filter: Callable[[str], Filter] = SeamFilter,
    realwire: Path | None = REALWIRE,
) -> tuple[list[Row], list[LongRepeat]]:
    """Measure, print the tables, return the rows and the long repeats."""
    every = 7 if quick else 1
    texts = corpus(realwire)
    streams = sum(1 for t in texts if t.kind == "realwire")
    rows = measure(make_filter, every, texts)
    quick_note = f" (quick: every 7th cut, the project docs' every {7 * QUICK_README}th)"
    print(f"## Seam accuracy{quick_note if quick else ''}; {machine_line()}")
    if realwire is None or not streams:
        print(f"(no recorded real streams: {realwire} is absent; the corpus alone is cut)")
    else:
        print(f"(with the text of {streams} recorded real streams from {realwire})")
    print()
    _print_families(rows)
    print()
    print("## Natural cuts, per text")
    _print_natural(rows)
    print()
    print("## The ambiguities, both ways")
    print(
        "(each class kept by design, and a filter that removes it instead: how many of its"
        " repeats that removes, and what it wrongly deletes from natural cuts, by text)"
    )
    _print_ambiguities(other_sides(rows, every, texts))
    print()
    sizes = (20_000,) if quick else (200_000,)
    long = [
        time_long_repeat(make_filter, size, repeat, lead)
        for size in sizes
        for repeat in (1_500, 20_000 if quick else 100_000)
        for lead in ("", " ")
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
    parser.add_argument(
        "--realwire", type=Path, default=REALWIRE, help="directory of recorded .sse streams"
    )
    arguments = parser.parse_args()
    main(arguments.quick, realwire=arguments.realwire)
