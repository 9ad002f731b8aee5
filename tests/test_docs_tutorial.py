"""The code blocks of the docs copied from the tested tutorial project equal its files.

The pages hold plain fenced blocks, so they read on GitHub as on the docs site; a block
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
PAGES = {
    str(path.relative_to(DOCS)): path.read_text()
    for path in sorted(DOCS.rglob("*.md"))
    if "_build" not in path.parts
}
COPIED_BLOCK = re.compile(
    r"^<!-- from: (?P<path>\S+)(?: \[(?P<section>[\w-]+)\])? -->\n"
    r"```\w*\n(?P<code>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
BLOCKS = [(name, block) for name, text in PAGES.items() for block in COPIED_BLOCK.finditer(text)]


def source(path, section):
    text = (DOCS / path).read_text()
    if section is None:
        return text
    lines = text.splitlines(keepends=True)
    start = lines.index(f"# [{section}]\n") + 1
    return "".join(lines[start : lines.index(f"# [/{section}]\n")])


def test_every_marker_is_followed_by_its_block():
    assert PAGE.count("<!-- from: ") > 0
    assert len(BLOCKS) == sum(text.count("<!-- from: ") for text in PAGES.values())
    for name, text in PAGES.items():
        assert "{literalinclude}" not in text, f"docs/{name}: an empty directive on GitHub"


@pytest.mark.parametrize(
    ("page", "block"),
    BLOCKS,
    ids=[" ".join(filter(None, (page, *block.group("path", "section")))) for page, block in BLOCKS],
)
def test_the_block_equals_its_source(page, block):
    assert block["code"] == source(block["path"], block["section"]), (
        f"docs/{page}: copy {block['path']} {block['section'] or ''} into its block again"
    )
