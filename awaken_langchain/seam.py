"""Seam de-duplication: removing what a provider repeats at the start of a continuation.

A continuation request carries the prefix the caller has seen with its trailing
whitespace stripped. An exact provider answers with that whitespace and the rest
of the text. Other providers first repeat the end of the prefix, then continue:
from the start of a word (``"The"`` + ``"The capital…"``), from the space before
a word, as their tokens carry it (``"…jumps over the"`` + ``" over the lazy…"``),
or from a line's indentation. :class:`SeamFilter` holds back the start of the
continuation while it could still be such a repeat and removes it, and otherwise
passes the text through unchanged.

The rule is never to delete real text. A repeat is a suffix of the prefix that
the continuation starts with; it starts at a word start (after whitespace, or
anywhere in CJK text, which has no spaces) or in the whitespace before one (the
prefix counts as starting after a space); in a line's indentation, at its start
or at its last space (the token before the line's first word carries that
space). It is removed when repeating it is not what a text does:

- **glued**, starting at a word (it joins the prefix's last word without a
  space): two characters or more with a letter (``"I'mI'm"``, ``"TheThe"`` are
  not text), or two words with a letter or digit; or a word cut after its
  first letter, a capital, when the continuation has a lowercase letter or an
  apostrophe after it (``"T"`` + ``"The"``, ``"I"`` + ``"I'm"``): left in, the
  word would begin ``"TThe"``. Other single letters are kept: words begin
  with a doubled letter (``"uuid"``, ``"LLM"``, ``"II"``). So are single words
  without a letter: ``"2020"`` is ``"20"`` twice, ``"--flag"`` and ``"===="``
  double a mark;
- **indented**, starting at a line's whole indentation of two characters or
  more: as a glued one (``'    "day":'`` + ``'    "day": "Monday"'``). Left in,
  the line would hold its first word again after the same whitespace, which
  only a column that repeats its first cell does. After an indentation of one
  character, as a spaced one;
- **spaced**, starting after a space on the same line (the last space of an
  indentation too): two words or more, one of them with a letter (``" over
  the"``), or two with a digit (``" 2024 05"``). A single word after a space
  is kept: ``"he had"`` + ``" had a dog"`` is as often a real doubled word
  (``"had had"``, ``"that that"``) as a repeat;
- **at a line break** (in the whitespace before one, or on a line of its own
  with no letter or digit, such as a table row's closing ``"|"``): kept. It is
  the whole last line again, which texts repeat for real (a refrain, a table
  row); providers restart a line from its first word, which is a glued repeat.

Any repeat with 4 CJK characters or more is removed (``"研究研究"`` is real
text). Whatever its kind, a repeat is kept when:

- it is one run of a repeated pattern (``"-----"``, ``"0000"``, ``"哈哈哈"``,
  ``"ha ha"``, ``"| 0 | 0"``), which a text repeats for real;
- it begins with a space and the prefix already has it right before it: the
  text is repeating itself (``"| n/a | n/a"`` + ``" | n/a"``);
- the prefix ends in a Markdown table row and the repeat is not the whole row:
  tables repeat cells for real.

A prefix that ended with whitespace ends with a whole word, so there a repeat
must also end where a word of the continuation ends: ``"Half an "`` +
``"answer."`` repeats nothing, while ``"The capi"`` + ``"capital"`` restarts a
cut-off word.

After the repeat (or at once when there is none), only the whitespace the
continuation request stripped is dropped, as far as the continuation repeats it.
"""

from __future__ import annotations

from typing import Literal

MIN_WORDS = 2
"""A spaced repeat of this many words (one with a letter) is removed; any repeat of
this many words with a letter or digit is."""
MIN_CHARS = 2
"""A glued repeat of this many characters (one a letter) is removed."""
MIN_CJK_CHARS = 4
"""A repeat with this many CJK characters or more is removed (CJK has no spaces)."""
MIN_INDENT = 2
"""A repeat that begins with a line's whole indentation of this many characters or
more is removed as a glued one; after less, as a spaced one."""
APOSTROPHES = "'\u2019"
"""A straight and a typographic apostrophe."""

Kind = Literal["glued", "indented", "broken", "spaced"]
"""Where a repeat starts: at a word; at a line's indentation; at a line break
(in the whitespace before it); after a space on the same line."""

_UNSPACED_RANGES = (
    (0x3000, 0x30FF),  # CJK symbols and punctuation, hiragana, katakana
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF00, 0xFFEF),  # half- and full-width forms
    (0x20000, 0x3134F),  # CJK extensions B to G
)


def is_unspaced(char: str) -> bool:
    """Whether ``char`` belongs to a script written without spaces (CJK)."""
    code = ord(char)
    return code >= 0x3000 and any(low <= code <= high for low, high in _UNSPACED_RANGES)


def is_word_start(text: str, index: int) -> bool:
    """Whether a word starts at ``text[index]``.

    A word starts at a character that is not whitespace and follows whitespace
    or the start of the text; in CJK text, at every character.
    """
    char = text[index]
    if char.isspace():
        return False
    if index == 0:
        return True
    before = text[index - 1]
    return before.isspace() or is_unspaced(before) or is_unspaced(char)


def is_repeat_start(text: str, index: int) -> bool:
    """Whether a repeat may start at ``text[index]``.

    At a word start, or in whitespace, but inside a line's indentation only at
    its start or its last character: a provider that repeats a line repeats all
    of its indentation, or restarts from the token that carries the space
    before the line's first word (a JSON line ``'    "day": "'`` restarted as
    ``' "day": "Monday"'``).
    """
    char = text[index]
    if not char.isspace():
        return is_word_start(text, index)
    before = index - 1
    if before < 0 or text[before] == "\n" or not text[before].isspace():
        return True
    if char == " " and index + 1 < len(text) and not text[index + 1].isspace():
        return True
    while before > 0 and text[before - 1].isspace():
        before -= 1
        if text[before] == "\n":
            return False
    return True


def repeat_kind(text: str, index: int) -> Kind:
    """The kind of a repeat of ``text[index:]`` (``index`` a repeat start)."""
    if not text[index].isspace():
        line_end = text.find("\n", index)
        first_line = text[index:line_end] if line_end >= 0 else ""
        return "broken" if first_line and not any(c.isalnum() for c in first_line) else "glued"
    end = index
    while end < len(text) and text[end].isspace():
        end += 1
    if "\n" in text[index:end]:
        return "broken"
    if index and text[index - 1] == "\n":
        return "indented"
    return "spaced"


def is_removable_size(repeat: str, kind: Kind = "glued", after: str = "") -> bool:
    """Whether ``repeat``, of ``kind``, is long enough that repeating it is not real text.

    ``after`` is the continuation's character after the repeat ("" when it has
    not arrived): a glued capital letter is removed when a lowercase letter or
    an apostrophe follows it (``"T"`` + ``"The"``, ``"I"`` + ``"I'm"``).
    """
    body = repeat.lstrip()
    if sum(1 for c in body if c.isalnum() and is_unspaced(c)) >= MIN_CJK_CHARS:
        return True
    if kind == "broken":
        return False
    letter = any(c.isalpha() and not is_unspaced(c) for c in body)
    if kind == "spaced" or (kind == "indented" and len(repeat) - len(body) < MIN_INDENT):
        words = body.split(None, MIN_WORDS)
        if len(words) < MIN_WORDS:
            return False
        return letter or sum(1 for w in words if any(c.isalnum() for c in w)) >= MIN_WORDS
    named = sum(1 for word in body.split(None, MIN_WORDS) if any(c.isalnum() for c in word))
    if (letter and len(body) >= MIN_CHARS) or named >= MIN_WORDS:
        return True
    return is_capital_restart(body + after)


def is_capital_restart(text: str) -> bool:
    """Whether ``text`` restarts a word cut after its first letter, a capital.

    ``text`` is the continuation of a prefix that ends with its first character
    as the start of a word: a capital letter, then a lowercase letter or an
    apostrophe (``"T"`` + ``"The"``, ``"I"`` + ``"I'm"``). Left in, the word
    would begin with the same capital twice before a lowercase letter
    (``"TThe"``), which text does not write; other doubled first letters are
    words (``"uuid"``, ``"II"``, ``"LLM"``).
    """
    return (
        len(text) >= 2
        and text[0].isupper()
        and not is_unspaced(text[0])
        and (text[1].islower() or text[1] in APOSTROPHES)
    )


def is_pattern_run(repeat: str) -> bool:
    """Whether ``repeat`` is one run of a repeated pattern (``"-=-=-="``, ``"ha ha"``).

    Such a run (a rule line, a number of zeros, laughter, a row of equal table
    cells) is as likely the text's own as a provider's repeat, so it is never
    removed.
    """
    size = len(repeat)
    half = size // 2
    head = repeat[: size - half]
    shift = repeat.find(head, 1, half + len(head))
    while shift != -1:
        if repeat[shift:] == repeat[:-shift]:
            return True
        shift = repeat.find(head, shift + 1, half + len(head))
    return False


def is_removable_repeat(text: str, index: int, after: str = "") -> bool:
    """Whether a continuation that starts with ``text[index:]`` repeats it, to be removed.

    ``text`` is the prefix as the continuation request carried it (stripped);
    ``after`` is the continuation's character after the repeat, if known.
    """
    if not is_repeat_start(text, index):
        return False
    repeat = text[index:]
    kind = repeat_kind(text, index)
    if not is_removable_size(repeat, kind, after):
        return False
    body = repeat.lstrip()
    before = index
    while before and text[before - 1].isspace():
        before -= 1
    again = before - len(body)
    if is_pattern_run(body) or (
        kind == "spaced"
        and again >= 0
        and text.endswith(body, 0, before)
        and is_word_start(text, again)
    ):
        return False
    row = text.rfind("\n") + 1
    while text[row].isspace():
        row += 1
    return index <= row or text[row] != "|"  # in a table row, only the whole row


def _joins(last: str, after: str) -> bool:
    """Whether ``after`` goes on the word that ``last`` ends (both letters or digits)."""
    return last.isalnum() and after.isalnum() and not is_unspaced(last) and not is_unspaced(after)


class SeamFilter:
    """Removes text a provider repeats at the start of a continuation.

    Feed the continuation's text as it arrives; :meth:`feed` returns what may
    be released. The filter holds text back only while it could still be a
    repeat of the prefix's end, then releases it (minus the repeat) and
    becomes a pass-through. Call :meth:`flush` when the text ends.

    Holding back costs one comparison of the new text per piece, plus a search
    of the prefix when a possible repeat stops matching; a repeat of any length,
    up to the whole prefix, is recognised.

    Args:
        prefix: The text of the turn the caller has already received.
    """

    def __init__(self, prefix: str) -> None:
        self._sent = prefix.rstrip()
        """The prefix as the continuation request carried it."""
        self._stripped = prefix[len(self._sent) :]
        """The whitespace the request stripped; an exact provider re-emits it."""
        self._text = " " + self._sent if self._sent else ""
        """Where repeats are looked for: the sent prefix after a space, as a provider
        that repeats all of it may begin with the space its first token carries."""
        self._capital = (
            not self._stripped
            and bool(self._sent)
            and self._sent[-1].isupper()
            and is_word_start(self._text, len(self._text) - 1)
        )
        """Whether the prefix ends inside a word at its first letter, a capital, which
        is a repeat when the character after it in the continuation says so."""
        self._last_start = self._last_removable_start()
        """The last repeat start whose suffix is long enough to be removed (-1: none)."""
        self._parts: list[str] = []
        self._held = 0
        self._candidate = -1
        """Where in the prefix the held text is a growing match, or -1."""
        self._repeat = 0
        """The longest removable repeat found so far (characters)."""
        self._decided = not self._sent
        self._whitespace = ""
        """What is left of the stripped whitespace to drop from the next text."""
        self.removed_chars = 0
        """How many characters were dropped as repetition (including whitespace)."""

    @property
    def pending(self) -> bool:
        """Whether text is being held back."""
        return not self._decided

    @property
    def active(self) -> bool:
        """Whether the next text may still be changed (held back or trimmed)."""
        return not self._decided or bool(self._whitespace)

    def feed(self, text: str) -> str:
        """Take the next piece of continuation text and return what may be released."""
        if self._decided:
            return self._drop_whitespace(text) if self._whitespace else text
        if not text:
            return ""
        before = self._held
        previous = self._parts[-1][-1] if self._parts else ""
        self._parts.append(text)
        self._held += len(text)
        self._find_repeats_ending_in(before, text, previous)
        candidate = self._candidate
        if candidate >= 0:
            end = candidate + self._held
            whole = bool(self._stripped) or self._capital  # a whole match waits for the next
            if end < len(self._text) + whole and self._text.startswith(text, candidate + before):
                return ""
            start = candidate + 1
        else:
            start = 0
        self._candidate = self._search(start)
        return "" if self._candidate >= 0 else self._decide()

    def flush(self) -> str:
        """Release whatever is held back (the text ended, or another block began).

        With nothing held, the continuation's text has not begun (it opened
        with a thinking block or a tool call): the filter goes on waiting for
        it, and still drops the whitespace an exact provider re-emits.
        """
        if self._decided or not self._held:
            return ""
        if self._stripped:  # a repeat that ends with the text ends at a word end
            held = "".join(self._parts)
            index = len(self._text) - len(held)
            if (
                0 <= index <= self._last_start
                and self._text.endswith(held)
                and self._is_removable(index)
            ):
                self._repeat = len(held)
        released = self._decide()
        self._whitespace = ""
        return released

    def _is_removable(self, index: int, after: str = "") -> bool:
        """Whether a continuation that starts with ``self._text[index:]`` repeats it.

        ``after`` is the continuation's character after that, if known.
        """
        return is_removable_repeat(self._text, index, after)

    def _last_removable_start(self) -> int:
        """A bound: no repeat that starts after it is long enough to be removed (-1: none).

        Walks back from the end, counting what the suffix holds, so that the
        bound costs one pass however long the prefix.
        """
        sent = self._text
        if self._capital:
            return len(sent) - 1
        letter = named_word = False
        cjk = words = named = 0
        for index in range(len(sent) - 1, -1, -1):
            char = sent[index]
            if is_unspaced(char):
                cjk += char.isalnum()
            else:
                letter = letter or char.isalpha()
            named_word = (named_word or char.isalnum()) and not char.isspace()
            if not is_word_start(sent, index):
                continue
            words += 1
            named += named_word
            if (
                cjk >= MIN_CJK_CHARS
                or named >= MIN_WORDS
                or (letter and len(sent) - index >= MIN_CHARS)
            ):
                return index  # glued
            if letter and words >= MIN_WORDS and repeat_kind(sent, index - 1) == "spaced":
                return index - 1
        return -1

    def _find_repeats_ending_in(self, before: int, text: str, previous: str = "") -> None:
        """Record the longest removable repeat the held text now covers whole.

        A repeat is a suffix of the prefix that the held text starts with; those
        of ``before + 1`` to ``before + len(text)`` characters are checked. When
        the prefix ended with whitespace, its last word was whole, so a repeat
        must end where a word of the continuation ends (``"an"`` is not repeated
        in ``"answer"``): it is checked once the character after it has arrived,
        and ``previous`` is the held text's last character before ``text``.
        """
        sent = self._text
        if self._capital and before <= 1 < self._held:  # the capital's next character is in
            second = self._parts[0][1] if len(self._parts[0]) > 1 else self._parts[1][0]
            if self._parts[0][0] == sent[-1] and self._is_removable(len(sent) - 1, second):
                self._repeat = 1
        confirm = bool(self._stripped) and bool(previous or before == 0)
        low = max(len(sent) - self._held + confirm, 0)
        high = min(len(sent) - max(before + 1 - confirm, 1), self._last_start)
        if high < low:
            return
        first = self._parts[0][0]
        last_char = sent[-1]
        held: str | None = None
        index = sent.find(first, low, high + 1)
        while index != -1:
            size = len(sent) - index
            # the held text's character that must equal the prefix's last one
            end_char = text[size - 1 - before] if size > before else previous
            if end_char == last_char and is_repeat_start(sent, index):
                if held is None:
                    held = "".join(self._parts)
                    self._parts = [held]
                if (
                    held.startswith(sent[index:])
                    and (not confirm or not _joins(last_char, held[size]))
                    and self._is_removable(index)
                ):
                    self._repeat = size
                    return
            index = sent.find(first, index + 1, high + 1)

    def _search(self, start: int) -> int:
        """The first repeat start from ``start`` where the held text is a growing match."""
        held = "".join(self._parts)
        self._parts = [held]
        sent = self._text
        whole = bool(self._stripped) or self._capital  # a whole match waits for the next
        end = min(self._last_start, len(sent) - 1 - len(held) + whole) + len(held)
        index = sent.find(held, start, end)
        while index != -1 and not is_repeat_start(sent, index):
            index = sent.find(held, index + 1, end)
        return index

    def _decide(self) -> str:
        held = "".join(self._parts)
        self._parts = []
        self._decided = True
        self._whitespace = self._stripped
        self.removed_chars += self._repeat
        return self._drop_whitespace(held[self._repeat :])

    def _drop_whitespace(self, text: str) -> str:
        expected = self._whitespace
        same = 0
        for char, want in zip(text, expected, strict=False):
            if char != want:
                break
            same += 1
        self.removed_chars += same
        self._whitespace = expected[same:] if same == len(text) else ""
        return text[same:]
