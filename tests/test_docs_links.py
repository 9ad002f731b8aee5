"""The docs read on GitHub as they do in the Sphinx site: no Sphinx-only cross-reference
role (GitHub shows ``{doc}`page``` as plain text), and every relative Markdown link leads
to a file that exists."""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {"_build", ".venv", ".tox", "node_modules", "results", "build"}


def _pages():
    """The Markdown pages of the tree. Walked with `os.walk`, which passes over a folder
    that vanishes meanwhile: a tox leg beside this one builds the sdist in this tree, and
    setuptools assembles it in a `django_outboxes-<version>` folder it then deletes."""
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [
            name
            for name in subfolders
            if name not in SKIPPED
            and not name.startswith("django_outboxes-")
            and not name.endswith(".egg-info")
        ]
        yield from (Path(folder) / name for name in files if name.endswith(".md"))


PAGES = sorted(_pages())
# A Sphinx role GitHub cannot render, e.g. {doc}`page` or {ref}`label`.
ROLE = re.compile(r"\{(doc|ref|any|mod|func|class|meth|attr)\}`")
# [text](target), the target up to a space or the closing parenthesis.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:", "#")


def page_id(path):
    return str(path.relative_to(ROOT))


def test_the_pages_are_found():
    names = {page_id(path) for path in PAGES}
    assert {"README.md", "docs/security.md", "docs/howto/relays.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_sphinx_role_and_no_broken_relative_link(page):
    text = page.read_text()
    roles = [match.group() for match in ROLE.finditer(text)]
    assert not roles, f"{page_id(page)} uses Sphinx roles GitHub shows as text: {roles}"
    broken = [
        target
        for target in LINK.findall(text)
        if not target.startswith(EXTERNAL) and not (page.parent / target.split("#")[0]).exists()
    ]
    assert not broken, f"{page_id(page)} links to missing files: {broken}"
