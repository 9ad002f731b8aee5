"""ARCHITECTURE.md is the map of `outbox/` for the next engineer: a module it does not
name is one a reader cannot find from it. Every module under `outbox/` (but migrations
and package `__init__` files) is named there by its file name, and every folder on its
path by `folder/`."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "outbox"


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if "migrations" in relative.parts or path.name == "__init__.py":
            continue
        yield relative


def test_every_module_under_outbox_is_on_the_map():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    missing = [
        str(module)
        for module in modules()
        if module.name not in text or any(f"{folder}/" not in text for folder in module.parts[:-1])
    ]
    assert not missing, f"ARCHITECTURE.md does not name: {', '.join(missing)}"
