import pytest

from tests.testapp.receivers import recorder


@pytest.fixture(autouse=True)
def clean_recorder():
    recorder.reset()
    yield recorder
    recorder.reset()
