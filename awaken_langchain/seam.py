"""Seam de-duplication: removing what a provider repeats at the start of a continuation.

A continuation request carries the prefix the caller has seen with its trailing
whitespace stripped. An exact provider answers with that whitespace and the rest
of the text. Other providers first repeat the end of the prefix, from the start
of a word, a sentence or a paragraph, then continue. :class:`SeamFilter` holds
back the start of the continuation while it could still be such a repeat and
removes it, and otherwise passes the text through unchanged.

The rule is never to delete real text. A repeat is removed only when:

- the continuation starts with it directly: a continuation that starts with
  whitespace is exact (an exact provider re-emits the stripped whitespace, or
  the space before its next word, while a repeating provider restarts at a word);
- it is a suffix of the prefix that starts at a word start (after whitespace, or
  anywhere in CJK text, which has no spaces);
- it is long enough not to be a real repetition of the text: two words or more,
  12 characters or more, or 4 CJK characters or more ("that that", "had had",
  "研究研究" are real text and are kept);
- it is not a single run of a repeated pattern (``"-----"``, ``"0000"``,
  ``"哈哈哈"``), which a text repeats for real.

After the repeat (or at once when there is none), only the whitespace the
continuation request stripped is dropped, as far as the continuation repeats it.
"""

from __future__ import annotations

MIN_WORDS = 2
"""A repeat of this many words or more is removed."""
MIN_CHARS = 12
"""A repeat of this many characters or more is removed."""
MIN_CJK_CHARS = 4
"""A repeat with this many CJK characters or more is removed (CJK has no spaces)."""

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


def is_removable_size(repeat: str) -> bool:
    """Whether ``repeat`` is long enough that repeating it is not real text."""
    if len(repeat) >= MIN_CHARS:
        return True
    words = sum(1 for word in repeat.split() if any(c.isalnum() for c in word))
    if words >= MIN_WORDS:
        return True
    return sum(1 for c in repeat if c.isalnum() and is_unspaced(c)) >= MIN_CJK_CHARS


def is_pattern_run(repeat: str) -> bool:
    """Whether ``repeat`` is one unspaced run of a repeated pattern (``"-=-=-="``).

    Such a run (a rule line, a number of zeros, laughter) is as likely the
    text's own as a provider's repeat, so it is never removed.
    """
    if any(c.isspace() for c in repeat):
        return False
    size = len(repeat)
    half = size // 2
    head = repeat[: size - half]
    shift = repeat.find(head, 1, half + len(head))
    while shift != -1:
        if repeat[shift:] == repeat[:-shift]:
            return True
        shift = repeat.find(head, shift + 1, half + len(head))
    return False


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
        self._last_start = self._last_removable_start()
        """The last word start whose suffix is long enough to be removed (-1: none)."""
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
        if not self._held and text[0].isspace():  # an exact continuation
            self._decided = True
            self._whitespace = self._stripped
            return self._drop_whitespace(text)
        before = self._held
        self._parts.append(text)
        self._held += len(text)
        self._find_repeats_ending_in(before, text)
        candidate = self._candidate
        if candidate >= 0:
            end = candidate + self._held
            if end < len(self._sent) and self._sent.startswith(text, candidate + before):
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
        released = self._decide()
        self._whitespace = ""
        return released

    def _last_removable_start(self) -> int:
        sent = self._sent
        for index in range(len(sent) - 1, -1, -1):
            if is_word_start(sent, index) and (
                len(sent) - index >= MIN_CHARS or is_removable_size(sent[index:])
            ):
                return index
        return -1

    def _find_repeats_ending_in(self, before: int, text: str) -> None:
        """Record the longest removable repeat the held text now covers whole.

        A repeat is a suffix of the prefix that the held text starts with; those
        of ``before + 1`` to ``before + len(text)`` characters are checked.
        """
        sent = self._sent
        low = max(len(sent) - self._held, 0)
        high = min(len(sent) - before - 1, self._last_start)
        if high < low:
            return
        first = self._parts[0][0]
        last_char = sent[-1]
        held: str | None = None
        index = sent.find(first, low, high + 1)
        while index != -1:
            size = len(sent) - index
            # the held text's character that must equal the prefix's last one
            if text[size - 1 - before] == last_char and is_word_start(sent, index):
                if held is None:
                    held = "".join(self._parts)
                    self._parts = [held]
                if held.startswith(sent[index:]) and not is_pattern_run(sent[index:]):
                    self._repeat = size
                    return
            index = sent.find(first, index + 1, high + 1)

    def _search(self, start: int) -> int:
        """The first word start from ``start`` where the held text is a growing match."""
        held = "".join(self._parts)
        self._parts = [held]
        sent = self._sent
        end = min(self._last_start, len(sent) - 1 - len(held)) + len(held)
        index = sent.find(held, start, end)
        while index != -1 and not is_word_start(sent, index):
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
