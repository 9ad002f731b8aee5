"""The reference pages match the code: the settings table committed in the Markdown, and
what the docs site generates when it is built (scripts/docs.sh)."""

import importlib.util
import re
from pathlib import Path

import pytest

from outbox.conf import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _reference_extension():
    path = DOCS / "_ext" / "outbox_reference.py"
    spec = importlib.util.spec_from_file_location("outbox_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _reference_extension()


def test_the_generated_settings_table_lists_every_setting_with_its_default():
    rows = reference.settings_rows()
    assert [name for name, *_ in rows] == [f"OUTBOX_{name}" for name in SETTINGS]
    for (name, expected, default, doc), setting in zip(rows, SETTINGS.values(), strict=True):
        assert default == repr(setting.default), name
        assert expected == setting.expected, name
        assert doc == setting.doc and doc.strip(), name


def test_the_settings_page_holds_the_generated_table():
    page = (DOCS / "reference" / "settings.md").read_text()
    assert page == reference.with_settings_table(page), (
        "docs/reference/settings.md is stale: run python -m docs._ext.outbox_reference"
    )
    for name, *_ in reference.settings_rows():
        assert f"| `{name}` |" in page, name


def _documented_commands():
    page = (DOCS / "reference" / "commands.md").read_text()
    return re.findall(r"```\{outbox-command\} (\w+)", page)


def test_every_management_command_is_documented():
    commands = sorted(path.stem for path in (ROOT / "outbox/management/commands").glob("[!_]*.py"))
    assert sorted(_documented_commands()) == commands


@pytest.mark.parametrize("name", _documented_commands())
def test_the_commands_help_is_generated_from_its_parser(name):
    text = reference.command_help(name)
    assert text.startswith(f"usage: manage.py {name}")
    assert "--database" in text


def test_every_system_check_id_is_documented():
    in_code = set()
    for path in (ROOT / "outbox").rglob("*.py"):
        in_code |= set(re.findall(r"outbox\.[EW]\d{3}", path.read_text()))
    page = (DOCS / "reference" / "checks.md").read_text()
    assert in_code, "no check ids found in outbox/"
    assert sorted(check for check in in_code if check not in page) == []
