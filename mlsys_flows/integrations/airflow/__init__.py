"""The Airflow provider of mlsys-flows: run a system's Prefect deployment as an Airflow task.

- ``hooks.PrefectHook``: the Prefect API from an Airflow Connection of type ``prefect``
  (host = API URL, password = API key; login + password = a self-hosted server's basic auth).
- ``operators.MlsysFlowOperator``: validates the flow parameters, creates the run and defers to
  ``triggers.PrefectFlowRunTrigger``, which polls the run with an async client in the triggerer
  (no worker slot held while the flow runs); ``on_kill`` cancels the run; ``PrefectRunLink`` is
  the task's extra link to the run's page in the Prefect UI.

Airflow finds the provider through the ``apache_airflow_provider`` entry point (pyproject.toml),
which calls :func:`get_provider_info`. Nothing here imports prefect: Airflow and Prefect cannot
share one environment (docs/platform.md, section 4: Airflow); the modules talk to Prefect over REST.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

_INTEGRATION = "Prefect"


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata, in the form of Airflow's ``provider_info.schema.json``."""
    try:
        versions = [version("mlsys-flows")]
    except PackageNotFoundError:  # imported from a source tree that is not installed
        versions = []
    return {
        "package-name": "mlsys-flows",  # must equal the distribution's name: Airflow checks it
        "name": "mlsys-flows",
        "description": "Runs mlsys-flows systems (Prefect deployments) from Airflow: a hook with a "
                       "`prefect` connection type, a deferrable operator, a trigger and a link to the run.",
        "versions": versions,
        "integrations": [{"integration-name": _INTEGRATION, "external-doc-url": "https://docs.prefect.io/",
                          "tags": ["software"]}],
        "hooks": [{"integration-name": _INTEGRATION, "python-modules": ["mlsys_flows.integrations.airflow.hooks"]}],
        "operators": [{"integration-name": _INTEGRATION, "python-modules": ["mlsys_flows.integrations.airflow.operators"]}],
        "triggers": [{"integration-name": _INTEGRATION, "python-modules": ["mlsys_flows.integrations.airflow.triggers"]}],
        "connection-types": [{"connection-type": "prefect", "hook-class-name": "mlsys_flows.integrations.airflow.hooks.PrefectHook"}],
        "extra-links": ["mlsys_flows.integrations.airflow.operators.PrefectRunLink"],
    }
