import pytest


@pytest.fixture(autouse=True)
def _flows_use_prefect_api(prefect_api):
    """Every flow test runs against the session's Prefect test harness."""
    yield
