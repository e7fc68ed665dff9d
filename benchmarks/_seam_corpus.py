"""Texts for the seam accuracy benchmark, one per kind, written for it.

Each text is what a model might write: prose (with one paragraph longer than
1 500 characters, and real repetitions such as "that that" and "had had"),
Markdown lists, Python code, indented JSON, numbers, and CJK. The CJK text is
written with ``|`` between words (CJK has no spaces); :func:`cjk_words` turns it
into the text and its word spans.

Two more texts hold what a text repeats for real, so that a rule that deletes
every repeat shows up as wrongly deleting: :data:`DOUBLED` (doubled words and
phrases, lines and table cells) and :data:`SQUARES` (words that begin with a
piece written twice, "murmur", cut between the two pieces only by the cuts
inside a word).
"""

from __future__ import annotations

PROSE = """\
The report is based on one small study, so the authors are careful. They say that that \
result may not hold elsewhere. It will be better to wait for the second survey. Then he \
helped the team rewrite the summary, which had had three drafts already.

Recovery after an interrupted stream is a question of bookkeeping more than of cleverness. \
The client keeps every character it has shown to the reader, and when the connection drops \
it asks the model to continue from exactly that point. A careful model writes the rest of \
the answer and nothing else; a less careful one starts again a few words back, or repeats \
the whole sentence it was writing, and now and then it writes the entire paragraph a second \
time before it goes on. None of this is visible to the reader if the client compares the \
beginning of the new text with the end of the old one and drops what is the same. The \
comparison has to be strict, though. A sentence such as "it will be better" contains a \
short word followed by a longer word that begins with the same letters, and a naive \
comparison would swallow those letters and leave a sentence that no one wrote. Numbers are \
worse: a figure like one million, written as digits, can be cut between two groups of zeros, \
and the second group looks exactly like the end of the first. Code and data add indentation, \
where a single missing space changes the meaning of a Markdown list or breaks the layout of \
a JSON document. So the rule is simple to state and harder to follow: remove a repetition \
only when it really is one, keep the text when in doubt, and never touch the whitespace that \
the request itself did not remove. The reader should never notice that anything happened at \
all, and the final message should be the same, byte for byte, as if the stream had never \
been interrupted in the first place.

Short paragraphs end the text. Was it worth it? Yes, it was.
"""

MARKDOWN = """\
# Release checklist

Before a release:

- Update the changelog.
  - List every public change.
  - Credit the people who reported problems.
- Run the whole test suite.
  1. Unit tests first.
  2. Then the integration tests, which need a running server.
- Tag the commit and push the tag.

Setup
=====

Install the package with `pip install example`, then run `example --check`.

----------------------------------------

* **Bold item** with *emphasis* and a [link](https://example.com/docs/setup).
* Another item, nested below:
    * four spaces deep
    * still four spaces deep
"""

PYTHON = '''\
def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping intervals and return them sorted."""
    if not intervals:
        return []
    ordered = sorted(intervals)
    merged = [ordered[0]]
    for start, end in ordered[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def add(self, amount: int = 1) -> int:
        self.count += amount
        return self.count
'''

JSON = """\
{
  "name": "example",
  "version": "1.0.0",
  "settings": {
    "retries": 3,
    "timeout": 10.5,
    "regions": ["eu-west-1", "us-east-1"],
    "enabled": true
  },
  "items": [
    {"id": 1, "label": "first", "tags": []},
    {"id": 2, "label": "second", "tags": ["a", "b"]}
  ],
  "description": null
}
"""

NUMBERS = """\
In 1990 the town had 1000 people; by 2020 it had 1000000 people, and the budget grew \
from 2500000 to 31400000 dollars. The ratio is 3.14159, the error 0.000001, and the \
account number 4000 1234 5678 9010 was closed on 2024-01-15 at 09:30:00. Prices: 19.99, \
199.99 and 1999.99; totals 10,000,000 and 12,500. Version 10.0.19045 replaced 6.1.7601.
"""

CJK = (  # full-width punctuation is meant: this is CJK text
    "我们|今天|去|东京|看|樱花|。|天气|很|好|，|大家|都|很|高兴|。|"  # noqa: RUF001
    "他|说|研究|研究|这个|问题|需要|时间|，|我们|应该|慢慢|来|。|"  # noqa: RUF001
    "この|プログラム|は|データ|を|読み込んで|、|結果|を|画面|に|表示|します|。|"
    "ありがとう|ございます|。|明日|また|会い|ましょう|。"
)


def cjk_words() -> tuple[str, list[tuple[int, int]]]:
    """The CJK text and the span of each of its words."""
    spans = []
    position = 0
    for word in CJK.split("|"):
        spans.append((position, position + len(word)))
        position += len(word)
    return CJK.replace("|", ""), spans


DOUBLED = """\
He had had enough of it, and she said that that was fine. It was very very cold, so \
they said bye bye and left. No no no, not that one. Ha ha, very funny. We went to \
Walla Walla, then to Baden-Baden, and sang "New York, New York" all the way home. \
The the is a typo, and so is is.

| option   | default | staging | production |
|----------|---------|---------|------------|
| retries  | 3       | 3       | 3          |
| timeout  | 10      | 10      | 30         |
| region   | not set | not set | eu-west-1  |
| cache    | on      | on      | on         |
| cache    | on      | on      | on         |

Sing it again:
Row, row, row your boat,
Row, row, row your boat,
gently down the stream.

    pass
    pass
"""

SQUARES = """The murmur of the crowd grew as couscous and bonbons were served; a tsetse fly, \
the cancan dancers and a tartar sauce. Mama and papa laughed: haha, hehe.
"""

TEXTS = {
    "prose": PROSE,
    "markdown": MARKDOWN,
    "python": PYTHON,
    "json": JSON,
    "numbers": NUMBERS,
    "doubled": DOUBLED,
    "squares": SQUARES,
}
"""The texts whose words are separated by whitespace, by kind."""
