"""Browser tests: headless Chromium from Debian driven by Playwright against Django's live
server. `bash scripts/setup_browser.sh` installs both; without them the tests skip."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib import admin
from django.test import override_settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def missing() -> str:
    """Why the browser tests cannot run here, or "" when they can. With
    OUTBOX_REQUIRE_BROWSER=1 (CI) a missing browser fails the run instead of skipping."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed: run scripts/setup_browser.sh"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: run scripts/setup_browser.sh as root"
    return ""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives headless Chromium (Playwright)")
    if os.environ.get("OUTBOX_REQUIRE_BROWSER") == "1" and missing():
        raise pytest.UsageError(f"OUTBOX_REQUIRE_BROWSER=1 but {missing()}")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium per module. Playwright's sync API runs an event loop in this
    thread while it lives, and Django refuses ORM calls under a running loop unless
    DJANGO_ALLOW_ASYNC_UNSAFE is set: set it for these tests only, and stop Playwright
    (and its loop) when the module is done, so the tests after it run as usual."""
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            yield chromium
            chromium.close()


# The test settings have no static files app or STATIC_URL; the live server serves the
# admin's own CSS and JavaScript from its package so that pages render as they do live.
ADMIN_STATIC = {
    "STATIC_URL": "/static/",
    "STATIC_ROOT": str(Path(admin.__file__).parent / "static"),
}


@pytest.fixture(scope="session")
def live_server(request: pytest.FixtureRequest) -> Iterator[object]:
    """pytest-django's live server, started with a STATIC_URL (its static files handler
    reads it once, at start)."""
    from pytest_django.live_server_helper import LiveServer

    with override_settings(**ADMIN_STATIC):
        server = LiveServer(request.config.getvalue("liveserver") or "localhost")
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def admin_static(settings: object) -> None:
    for name, value in ADMIN_STATIC.items():
        setattr(settings, name, value)
