"""mlsys-flows: published ML-systems techniques as Prefect flows on Dask.

Importing the package imports nothing else (the CLI lists systems without starting Prefect).
"""


def connect() -> str:
    """Point this Python session at the project's Prefect API, the one every `mlsys-flows` command
    uses: ``PREFECT_API_URL`` when set, else the running `mlsys-flows server` (its ``server.json`` under
    ``MLSYS_FLOWS_HOME``), else the project's home (``MLSYS_FLOWS_HOME/prefect``) through an embedded API
    that this session starts and stops at its end. Call it before saving or loading a block or a Secret:
    without it Prefect uses its default profile (``~/.prefect``), which neither the server nor
    `mlsys-flows run` reads. Works also when prefect was imported first. Returns the API URL."""
    from mlsys_flows.platform.runner import connect_session

    return connect_session()
