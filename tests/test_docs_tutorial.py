"""The code blocks of docs/tutorial.md equal the files of the tested tutorial project.

The page holds plain fenced blocks, so it reads on GitHub as on the docs site; a block
copied from docs/tutorial_project/ sits right after an HTML comment naming its source,
invisible once rendered:

    <!-- from: tutorial_project/shop/models.py -->        the whole file
    <!-- from: tutorial_project/tutorial.sh [migrate] -->  the lines between
                                                           "# [migrate]" and "# [/migrate]"

Paths are relative to docs/. tests/test_tutorial.py runs the project itself.
"""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = (DOCS / "tutorial.md").read_text()
COPIED_BLOCK = re.compile(
    r"^<!-- from: (?P<path>\S+)(?: \[(?P<section>[\w-]+)\])? -->\n"
    r"```\w*\n(?P<code>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
BLOCKS = list(COPIED_BLOCK.finditer(PAGE))


def source(path, section):
    text = (DOCS / path).read_text()
    if section is None:
        return text
    lines = text.splitlines(keepends=True)
    start = lines.index(f"# [{section}]\n") + 1
    return "".join(lines[start : lines.index(f"# [/{section}]\n")])


def test_every_marker_is_followed_by_its_block():
    assert len(BLOCKS) == PAGE.count("<!-- from: ") > 0
    assert "{literalinclude}" not in PAGE  # an empty directive on GitHub


@pytest.mark.parametrize(
    "block",
    BLOCKS,
    ids=[" ".join(filter(None, block.group("path", "section"))) for block in BLOCKS],
)
def test_the_block_equals_its_source(block):
    assert block["code"] == source(block["path"], block["section"]), (
        f"docs/tutorial.md: copy {block['path']} {block['section'] or ''} into its block again"
    )
