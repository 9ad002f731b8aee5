from pathlib import Path

from outbox.conf import SETTINGS

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_every_setting_is_documented_with_its_default():
    for name, setting in SETTINGS.items():
        rows = [line for line in README.splitlines() if line.startswith(f"| `OUTBOX_{name}`")]
        row = rows[0] if rows else None
        assert row is not None, f"OUTBOX_{name} is missing from the README settings table"
        assert f"`{setting.default!r}`" in row, f"OUTBOX_{name}: README default differs"
