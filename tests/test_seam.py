"""Seam de-duplication: only real repeats are removed, and never a character of real text."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from awaken_langchain.recovery import SeamFilter as ReExported
from awaken_langchain.seam import SeamFilter, is_pattern_run, is_word_start
from benchmarks._seam_corpus import DOUBLED, TEXTS

VOCABULARY = """
the report is based one small study so authors are careful they say result may not hold
elsewhere will be better to wait for second survey then she helped team rewrite summary
which had three drafts already numbers like 1000 2024 internationalization
responsibilities implementation
"""
WORDS = VOCABULARY.split()
"""A vocabulary in which no word ends with another (see the first test)."""
PUNCTUATION = ["", "", "", ",", ".", ":", ";", ")", "?"]
SEPARATORS = [" ", " ", " ", " ", "\n", "\n\n", "\n  ", "\n    ", "  ", "\t"]
CJK_VOCABULARY = "我们 今天 东京 樱花 天气 大家 高兴 研究 问题 需要 时间 应该 データ 結果 画面 表示"
CJK_WORDS = CJK_VOCABULARY.split()
CJK_PUNCTUATION = ["", "", "\uff0c", "\u3002"]
"""Nothing, or a CJK comma or full stop."""


def run(prefix: str, pieces: list[str]) -> str:
    seam = SeamFilter(prefix)
    return "".join(seam.feed(p) for p in pieces) + seam.flush()


def continued(prefix: str, continuation: str) -> str:
    """What the caller ends up with: the prefix, then the filtered continuation."""
    return prefix + run(prefix, [continuation])


def kept(prefix: str, continuation: str) -> str:
    """What the caller ends up with when nothing is a repeat: only the re-emitted
    whitespace the request stripped is dropped."""
    stripped = prefix[len(prefix.rstrip()) :]
    same = next(
        (i for i, (a, b) in enumerate(zip(stripped, continuation, strict=False)) if a != b),
        min(len(stripped), len(continuation)),
    )
    return prefix + continuation[same:]


@st.composite
def prose(draw: st.DrawFn, *, unique: bool = False) -> str:
    """Words with punctuation, joined by spaces, newlines and indentation."""
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=30, unique=unique))
    parts = [draw(st.sampled_from(SEPARATORS)) if draw(st.booleans()) else ""]
    for word in words:
        parts += [word, draw(st.sampled_from(PUNCTUATION)), draw(st.sampled_from(SEPARATORS))]
    return "".join(parts[:-1]) + draw(st.sampled_from(["", "\n", " "]))


@st.composite
def cjk(draw: st.DrawFn) -> str:
    """CJK words and punctuation, without spaces."""
    words = draw(st.lists(st.sampled_from(CJK_WORDS), min_size=1, max_size=12, unique=True))
    return "".join(w + draw(st.sampled_from(CJK_PUNCTUATION)) for w in words)


def cuts(text: str) -> range:
    """Every cut after which the caller holds some non-whitespace text."""
    first = len(text) - len(text.lstrip())
    return range(first + 1, len(text))


def exact(text: str, cut: int) -> tuple[str, str]:
    """The prefix a caller saw, and an exact provider's continuation of it."""
    prefix = text[:cut]
    return prefix, text[len(prefix.rstrip()) :]


def test_the_vocabulary_has_no_word_ending_with_another() -> None:
    assert not [(a, b) for a in WORDS for b in WORDS if a != b and a.endswith(b)]


def test_seam_filter_is_re_exported_from_recovery() -> None:
    assert ReExported is SeamFilter


# -- properties ---------------------------------------------------------------------------


@given(prose(unique=True))
def test_an_exact_continuation_gives_the_uncut_text_at_every_cut(text: str) -> None:
    for cut in cuts(text):
        assert continued(*exact(text, cut)) == text


@given(prose(), st.data())
def test_a_text_that_doubles_a_word_after_a_space_keeps_it_at_every_cut(
    text: str, data: st.DataObject
) -> None:
    words = list(re.finditer(r"\S+", text))
    word = data.draw(st.sampled_from(words)).group()
    doubled = text.replace(word, f"{word} {word}", 1)
    for cut in cuts(doubled):
        prefix, continuation = exact(doubled, cut)
        sent = doubled[:cut].rstrip()
        rest = doubled[len(sent) :]
        lead = rest[: len(rest) - len(rest.lstrip())]
        said = [m.start() for m in re.finditer(r"\S+", sent)]
        after = rest.lstrip()
        line = sent[sent.rfind("\n") + 1 :]
        first = line.lstrip()
        indent = line[: len(line) - len(first)]
        if "\n" in sent and len(lead) >= 2 and lead == indent and after.startswith(first):
            continue  # a line's first word again after its whole indentation: removed, by rule
        if (
            lead
            and "\n" not in lead
            and any(
                after.startswith(sent[start:])
                and not after[len(sent) - start : len(sent) - start + 1].isalnum()
                for start in said[:-1]
            )
        ):
            # two words or more doubled ("a b" + " a b", "a b" + " a b,"): removed as a
            # repeat, by rule
            continue
        assert continued(prefix, continuation) == doubled


@pytest.mark.parametrize("text", ["the\n the the", "x\n\treturn\treturn 1", "a\n  if if"])
def test_a_word_repeated_after_one_space_or_tab_of_indentation_or_after_its_last_space_is_kept(
    text: str,
) -> None:
    """An indentation of one character, or its last space, is a spaced repeat: a word
    doubled after a space ("that that") is real text."""
    for cut in cuts(text):
        assert continued(*exact(text, cut)) == text


def test_a_word_repeated_after_the_same_two_spaces_as_its_lines_indentation_is_lost() -> None:
    """The indented rule's known cost: after a line's whole indentation of two characters
    or more, one word with a letter is removed as a glued one is. Left in, the text would
    hold a line's first word again after the same whitespace, which only a column that
    repeats its first cell writes; the benchmark deletes nothing with it."""
    assert continued("x\n    return", "    return 1") == "x\n    return 1"
    assert continued("x\n  the", "  the end") == "x\n  the end"


INDENTED = [
    '{\n    "day": "Monday",\n    "location": "San Francisco, CA",\n    "unit": "celsius"\n}',
    "def f(x):\n    total = x + 1\n    return total * 2\n",
    "- item one\n  - nested item two\n  - nested item three\n",
]


@pytest.mark.parametrize("text", INDENTED)
def test_a_line_restarted_from_the_space_before_its_first_word_is_removed(text: str) -> None:
    """Tokens carry their leading space, so a restart of an indented line may begin
    with the indentation's last space (``"    \"day\": \""`` + ``" \"day\": …"``)."""
    for cut in cuts(text):
        prefix = text[:cut]
        sent = prefix.rstrip()
        line = sent.rfind("\n") + 1
        first = line + len(sent[line:]) - len(sent[line:].lstrip())
        if first - line < 2 or len(sent[first:].split()) < 2:
            continue  # not indented by two or more, or one word: kept as a spaced word
        assert continued(prefix, text[first - 1 :]) == text
        assert continued(*exact(text, cut)) == text


@given(cjk())
def test_an_exact_cjk_continuation_gives_the_uncut_text_at_every_cut(text: str) -> None:
    for cut in cuts(text):
        assert continued(*exact(text, cut)) == text


def _restart(prefix: str, words: int) -> int:
    starts = [i for i in range(len(prefix)) if is_word_start(prefix, i)]
    return starts[-words]


@given(prose(unique=True), st.integers(2, 6), st.data())
def test_a_repeat_of_two_or_more_words_is_removed(
    text: str, words: int, data: st.DataObject
) -> None:
    for cut in cuts(text):
        prefix = text[:cut]
        sent = prefix.rstrip()
        if sum(is_word_start(sent, i) for i in range(len(sent))) < words:
            continue
        continuation = text[_restart(sent, words) :]
        assert continued(prefix, continuation) == text


@given(prose(unique=True))
def test_a_glued_repeat_of_the_last_word_is_removed_from_two_characters_with_a_letter(
    text: str,
) -> None:
    for cut in cuts(text):
        prefix = text[:cut]
        sent = prefix.rstrip()
        start = _restart(sent, 1)
        word = sent[start:]
        removed = len(word) >= 2 and any(c.isalpha() for c in word)
        expected = text if removed else prefix + text[start:]
        assert continued(prefix, text[start:]) == expected


@pytest.mark.parametrize("kind", ["prose", "markdown", "python", "json", "numbers", "doubled"])
def test_a_word_cut_after_its_capital_and_restarted_glued_is_removed_at_every_cut(
    kind: str,
) -> None:
    """A capital that a lowercase letter or an apostrophe follows in the continuation
    ("T" + "The", "I" + "I'm") is a restart: left in, the word would begin "TThe"."""
    text = TEXTS[kind]
    checked = 0
    for cut in cuts(text):
        prefix = text[:cut]
        if not (is_word_start(prefix, cut - 1) and prefix[-1].isupper()):
            continue
        if text[cut].islower() or text[cut] == "'":
            checked += 1
            assert continued(prefix, text[cut - 1 :]) == text
            assert prefix + run(prefix, list(text[cut - 1 :])) == text
        else:  # "World War I" + "II", "an L" + "LM": kept
            assert continued(prefix, text[cut - 1 :]) == prefix + text[cut - 1 :]
        assert continued(*exact(text, cut)) == text
    assert checked or kind in ("json", "numbers")


@pytest.mark.parametrize(
    ("prefix", "continuation", "expected"),
    [
        ("I", "I'm unable to help.", "I'm unable to help."),
        ("Then I", "I\u2019ll check.", "Then I\u2019ll check."),
        ("The capital is T", "Tokyo.", "The capital is Tokyo."),
        ("World War I", "I ended in 1945.", "World War II ended in 1945."),
        ("Ask an L", "LM to answer.", "Ask an LLM to answer."),
        ("Use a u", "uid here.", "Use a uuid here."),
        ("Use a u", "uuid here.", "Use a uuuid here."),
        ("Plan A ", "After that.", "Plan A After that."),
        ("See T", "T.", "See TT."),
    ],
)
def test_a_single_letter_is_removed_only_as_a_capital_before_a_lowercase_letter_or_apostrophe(
    prefix: str, continuation: str, expected: str
) -> None:
    """Other doubled first letters are words ("II", "LLM", "uuid"), so a lowercase or a
    capital before another capital, a digit or a space is kept, as after a whole word."""
    assert continued(prefix, continuation) == expected
    assert prefix + run(prefix, list(continuation)) == expected


def test_a_word_that_begins_with_a_capital_written_twice_before_a_lowercase_letter_loses_one() -> (
    None
):
    """The capital rule's known cost, as "murmur" is the glued rule's: a name such as
    "LLaMA" cut after its first letter."""
    assert continued("Meta's L", "LaMA model") == "Meta's LaMA model"


def _space_before(text: str, start: int) -> int | None:
    """Where the whitespace before the word at ``start`` begins, if it is on one line."""
    before = len(text[:start].rstrip())
    return None if "\n" in text[before:start] or before == start else before


@given(prose(unique=True), st.integers(2, 12))
def test_a_repeat_of_two_or_more_words_from_the_space_before_them_is_removed(
    text: str, words: int
) -> None:
    for cut in cuts(text):
        prefix = text[:cut]
        sent = prefix.rstrip()
        if sum(is_word_start(sent, i) for i in range(len(sent))) < words:
            continue
        space = _space_before(text, _restart(sent, words))
        if space is not None:
            assert continued(prefix, text[space:]) == text


@given(prose(unique=True))
def test_a_single_word_repeated_from_the_space_before_it_is_kept(text: str) -> None:
    for cut in cuts(text):
        prefix = text[:cut]
        sent = prefix.rstrip()
        space = _space_before(text, _restart(sent, 1))
        if space is not None:
            assert continued(prefix, text[space:]) == kept(prefix, text[space:])


@given(prose(unique=True))
def test_a_line_restarted_from_its_first_word_or_its_indentation_is_removed(text: str) -> None:
    for cut in cuts(text):
        prefix = text[:cut]
        sent = prefix.rstrip()
        line = sent.rfind("\n") + 1
        first = line + len(sent[line:]) - len(sent[line:].lstrip())
        repeat = sent[first:]
        if not any(c.isalpha() for c in repeat) or len(repeat) < 2:
            continue
        assert continued(prefix, text[first:]) == text
        if line and first > line and (first - line >= 2 or len(repeat.split()) >= 2):
            # from the whole indentation: one word too, but after a single space or tab
            assert continued(prefix, text[line:]) == text


@pytest.mark.parametrize("kind", ["python", "json"])
def test_a_line_of_one_word_restarted_with_its_whole_indentation_is_removed_at_every_cut(
    kind: str,
) -> None:
    """Models restart an indented line with its indentation (``'    "day":'`` +
    ``'    "day": "Monday"'``): one word with a letter after an indentation of two
    characters or more is removed, as a glued repeat is."""
    text = TEXTS[kind]
    checked = 0
    for cut in cuts(text):
        prefix = text[:cut]
        sent = prefix.rstrip()
        line = sent.rfind("\n") + 1
        first = line + len(sent[line:]) - len(sent[line:].lstrip())
        repeat = sent[first:]
        if first - line < 2 or len(repeat.split()) != 1 or not any(c.isalpha() for c in repeat):
            continue
        if is_pattern_run(repeat) or len(repeat) < 2:
            continue
        checked += 1
        assert continued(prefix, text[line:]) == text
        assert continued(*exact(text, cut)) == text
    assert checked > 20


@given(prose(unique=True))
def test_a_repeat_that_begins_with_a_line_break_is_kept(text: str) -> None:
    for cut in cuts(text):
        prefix = text[:cut]
        sent = prefix.rstrip()
        line = sent.rfind("\n")
        if line > 0 and not sent[:line].isspace():
            assert continued(prefix, text[line:]) == kept(prefix, text[line:])


@given(cjk(), st.integers(1, 3))
def test_a_cjk_repeat_is_removed_from_four_characters(text: str, words: int) -> None:
    for cut in cuts(text):
        prefix = text[:cut]
        starts = [i for i in range(len(prefix)) if is_word_start(prefix, i)]
        if len(starts) < words * 2:
            continue
        restart = starts[-words * 2]  # about two characters per word
        repeat = prefix[restart:]
        letters = sum(c.isalnum() for c in repeat)
        expected = text if letters >= 4 else prefix + text[restart:]
        assert continued(prefix, text[restart:]) == expected


@st.composite
def seams(draw: st.DrawFn) -> tuple[str, str, list[int]]:
    """A prefix, a continuation that often repeats its end, and where to split it."""
    alphabet = st.sampled_from(list("ab ab\n -研究TTh'"))
    prefix = draw(st.text(alphabet, max_size=40))
    start = draw(st.integers(0, len(prefix)))
    continuation = prefix[start:] + draw(st.text(alphabet, max_size=20))
    splits = draw(st.lists(st.integers(0, len(continuation)), max_size=8))
    return prefix, continuation, sorted(splits)


@settings(max_examples=300)
@given(seams())
def test_any_chunking_gives_the_same_text_as_feeding_it_whole(
    seam: tuple[str, str, list[int]],
) -> None:
    prefix, continuation, splits = seam
    bounds = [0, *splits, len(continuation)]
    pieces = [continuation[a:b] for a, b in itertools.pairwise(bounds)]
    assert run(prefix, pieces) == run(prefix, [continuation])
    assert run(prefix, list(continuation)) == run(prefix, [continuation])


# -- named regressions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "continuation"),
    [
        ("The summary is based on", " one small study."),
        ("I think it will be", " better tomorrow."),
        ("Then he", " helped the team."),
        ("The town had 1000", "000 people."),
        ("zeta theta", " eta iota"),
        ("zeta theta", "eta iota"),
    ],
)
def test_a_word_that_begins_like_the_prefixs_last_word_is_kept(
    prefix: str, continuation: str
) -> None:
    assert continued(prefix, continuation) == prefix + continuation


@pytest.mark.parametrize(
    "text",
    [
        '{\n  "a": 1,\n  "b": 2\n}',
        "- item one\n  - nested item\n  - another\n- item two",
        "def f():\n    if x:\n        return 1\n    return 2\n",
    ],
)
def test_indentation_at_the_seam_is_kept(text: str) -> None:
    for cut in cuts(text):
        assert continued(*exact(text, cut)) == text


def test_json_cut_before_an_indented_line_keeps_the_indentation() -> None:
    assert run('{\n  "a": 1,\n', ['\n  "b": 2\n}']) == '  "b": 2\n}'


@pytest.mark.parametrize(("prefix", "word"), [("He said that", " that"), ("She had", " had")])
def test_a_single_repeated_word_is_kept_after_a_space_and_removed_when_glued(
    prefix: str, word: str
) -> None:
    assert continued(prefix, word + " it.") == prefix + word + " it."
    assert continued(prefix, word.strip() + " it.") == prefix + " it."


@pytest.mark.parametrize(
    ("prefix", "continuation", "expected"),
    [
        (
            "The quick brown fox jumps over the",
            " over the lazy dog.",
            "The quick brown fox jumps over the lazy dog.",
        ),
        ("Red fish.", " Red fish. Blue fish.", "Red fish. Blue fish."),
        ("One fish. Red fish.", " Red fish. Blue fish.", "One fish. Red fish. Blue fish."),
        ("ant1 ant2 ant3 ant4", " ant3 ant4 ant5 ant6", "ant1 ant2 ant3 ant4 ant5 ant6"),
        ("w049 w050 w051 w052 ", " w051 w052 w053", "w049 w050 w051 w052 w053"),
        (
            "I'm",
            "I'm unable to provide real-time updates.",
            "I'm unable to provide real-time updates.",
        ),
        ("The", "The capital of Mexico is Mexico City.", "The capital of Mexico is Mexico City."),
        (
            "Features:\n- **Long",
            "- **Long, prominent bill** with a pouch",
            "Features:\n- **Long, prominent bill** with a pouch",
        ),
        (
            '{\n      {\n        "day": "',
            '"day": "Monday",',
            '{\n      {\n        "day": "Monday",',
        ),
        (
            '{\n      {\n        "day": "',
            '        "day": "Monday",',
            '{\n      {\n        "day": "Monday",',
        ),
        ("It is bright green (", "green (lime green).", "It is bright green (lime green)."),
        (
            'A sentence such as "',
            ' as "it will be better"',
            'A sentence such as "it will be better"',
        ),
    ],
)
def test_a_restart_that_models_make_is_removed(
    prefix: str, continuation: str, expected: str
) -> None:
    assert continued(prefix, continuation) == expected
    assert prefix + run(prefix, list(continuation)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "He had had enough of it.",
        "She said that that was fine.",
        "It was very very cold.",
        "They said bye bye and left.",
        "No no no, not that one.",
        "Ha ha ha ha, very funny.",
        "| region | not set | not set | eu-west-1 |",
        "| retries | 3 | 3 | 3 |",
        "| a | yes | yes |\n| b | no | no |",
        "| cache | on | on |\n| cache | on | on |\n",
        "Row, row, row your boat,\nRow, row, row your boat,\ngently down the stream.",
        "    pass\n    pass\n",
    ],
)
def test_a_text_that_repeats_words_lines_or_cells_for_real_is_kept_at_every_cut(text: str) -> None:
    for cut in cuts(text):
        assert continued(*exact(text, cut)) == text


def test_every_natural_cut_of_the_benchmark_corpus_is_kept_and_every_restart_removed() -> None:
    texts = [text for kind, text in TEXTS.items() if kind != "squares"]
    assert DOUBLED in texts
    for text in texts:
        spans = [m.span() for m in re.finditer(r"\S+", text)]
        starts = [start for start, _ in spans]
        for cut in cuts(text):
            prefix, continuation = exact(text, cut)
            assert continued(prefix, continuation) == text
            sent = prefix.rstrip()
            last = [s for s in starts if s < len(sent)][-3:]
            row = sent[sent.rfind("\n") + 1 :].lstrip()
            if len(last) == 3 and not row.startswith("|") and "\n" not in text[last[0] : len(sent)]:
                repeat = text[last[0] : len(sent)]
                space = _space_before(text, last[0])
                lettered = any(c.isalpha() for c in repeat)
                again = text[: last[0]].rstrip().endswith(repeat)
                if lettered and not is_pattern_run(repeat) and not again:
                    assert continued(prefix, text[last[0] :]) == text
                    if space is not None:
                        assert continued(prefix, text[space:]) == text


def test_a_word_that_begins_with_a_piece_written_twice_cut_between_them_loses_one() -> None:
    """The glued rule's known cost: "mur" + "mur" is taken for a restart of "mur"."""
    assert continued("The mur", "mur of the crowd") == "The mur of the crowd"
    assert continued("The murmur", " of the crowd") == "The murmur of the crowd"


def test_a_repeated_sentence_is_removed() -> None:
    prefix = "First things first. The second sentence is cut of"
    assert continued(prefix, "The second sentence is cut off here.") == prefix + "f here."


def test_a_paragraph_longer_than_1024_characters_is_removed() -> None:
    paragraph = " ".join(f"Sentence {n} says something new." for n in range(60))
    assert len(paragraph) > 1_500
    prefix = "Intro.\n\n" + paragraph
    pieces = list(paragraph + "\n\nNext.")
    assert prefix + run(prefix, pieces) == prefix + "\n\nNext."


def test_a_repeat_of_a_large_prefix_is_removed_when_fed_one_character_at_a_time() -> None:
    prefix = " ".join(f"word{n}" for n in range(40_000))  # about 270 KB
    repeat = prefix[prefix.index(" ", len(prefix) - 20_000) + 1 :]
    seam = SeamFilter(prefix)
    out = "".join(seam.feed(c) for c in repeat + " and more") + seam.flush()
    assert out == " and more"
    assert seam.removed_chars == len(repeat)


def test_a_rule_line_cut_in_the_middle_is_kept() -> None:
    text = "Title\n\n" + "-" * 40 + "\n\nBody."
    for cut in cuts(text):
        assert continued(*exact(text, cut)) == text


def test_cjk_reduplication_is_kept_and_four_repeated_characters_are_removed() -> None:
    assert continued("他说研究", "研究这个问题") == "他说研究研究这个问题"
    assert continued("他说研究这个", "研究这个问题") == "他说研究这个问题"


# -- streaming ------------------------------------------------------------------------------


def test_text_that_cannot_be_a_repeat_is_released_at_once() -> None:
    seam = SeamFilter("The quick brown fox ")
    assert seam.feed("z") == "z"
    assert not seam.pending


def test_text_is_held_only_while_it_could_still_be_a_repeat() -> None:
    seam = SeamFilter("The quick brown fox ")
    released = [seam.feed(c) for c in "quick brown fox jumps"]
    assert released[:15] == [""] * 15  # "quick brown fox" could be (and is) the repeat
    assert "".join(released) == "jumps"
    seam = SeamFilter("The quick brown fox ")
    released = [seam.feed(c) for c in "quick bread"]
    assert released[8:] == ["quick bre", "a", "d"]  # released once "bre" is not "bro"


def test_after_the_decision_the_filter_is_a_pass_through() -> None:
    seam = SeamFilter("The quick brown ")
    assert seam.feed(" fox") == "fox"
    assert not seam.active
    text = " jumps over"
    assert seam.feed(text) is text


def test_the_stripped_whitespace_is_dropped_across_pieces() -> None:
    seam = SeamFilter("Line one\n   ")
    assert [seam.feed(p) for p in ["\n", " ", "  x"]] == ["", "", "x"]
    assert seam.removed_chars == 4


def test_flush_releases_a_possible_repeat_that_never_completed() -> None:
    seam = SeamFilter("The quick brown fox ")
    assert seam.feed("quick bro") == ""
    assert seam.flush() == "quick bro"
    assert not seam.active


def test_a_flush_before_any_text_leaves_the_seam_waiting_for_the_text() -> None:
    seam = SeamFilter("Utrecht ")
    assert seam.flush() == ""  # a thinking block opened the continuation
    assert seam.pending
    assert seam.feed(" lies on") == "lies on"  # the stripped space, re-emitted, is dropped
    assert seam.removed_chars == 1


def test_a_continuation_that_starts_with_a_space_is_held_only_while_it_could_be_a_repeat() -> None:
    seam = SeamFilter("The quick brown fox ")
    released = [seam.feed(c) for c in " jumps"]
    assert released == ["", "j", "u", "m", "p", "s"]  # " j" is nowhere in the prefix
    seam = SeamFilter("The quick brown fox ")
    released = [seam.feed(c) for c in " brown fox jumps"]
    assert released[:10] == [""] * 10  # " brown fox" could be (and is) the repeat
    assert "".join(released) == "jumps"
    assert seam.removed_chars == len(" brown fox ")


@pytest.mark.parametrize(
    ("prefix", "continuation", "expected"),
    [
        ("Half an ", "answer.", "Half an answer."),
        ("Half an ", "an answer.", "Half an answer."),
        ("The quick brown ", "quick brownie recipe", "The quick brown quick brownie recipe"),
        ("The quick brown ", "quick brown fox", "The quick brown fox"),
        ("The quick brown", "quick brownie recipe", "The quick brownie recipe"),
    ],
)
def test_after_a_whole_word_a_repeat_must_end_where_a_word_of_the_continuation_ends(
    prefix: str, continuation: str, expected: str
) -> None:
    """A prefix that ends with whitespace ends with a whole word; one that does not may
    end inside one, which a provider restarts ("brown" + "brownie")."""
    assert continued(prefix, continuation) == expected
    assert prefix + run(prefix, list(continuation)) == expected
