from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"

    def ready(self) -> None:
        from tests.testapp import receivers  # noqa: F401
