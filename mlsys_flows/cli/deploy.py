"""`mlsys-flows deploy`: every flow as a Prefect deployment (prefect.yaml rendered from the registry)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from mlsys_flows.cli.console import api_url as resolve_api_url, console, fail
from mlsys_flows.settings import configure_prefect_home


def deploy(names: Optional[List[str]] = typer.Argument(None, help="Systems to deploy (default: all)."),
           write_yaml: bool = typer.Option(False, "--write-yaml", help="Only regenerate prefect.yaml from the registry."),
           check: bool = typer.Option(False, "--check", help="Only check that prefect.yaml matches the registry."),
           api_url: Optional[str] = typer.Option(None, help="Prefect API (default: PREFECT_API_URL or the running "
                                                           "`mlsys-flows server`)."),
           pool: str = typer.Option("mlsys-process", help="Work pool the deployments target (created if missing)."),
           image: Optional[str] = typer.Option(None, help="Worker image for a container pool, e.g. "
                                                         "mlsys-flows-worker:cpu (infra/docker/)."),
           pool_type: Optional[str] = typer.Option(None, help="Type of a pool created here (default: docker with "
                                                             "--image, else process)."),
           prefect_file: Optional[Path] = typer.Option(None, "--prefect-file", help="Deploy this prefect.yaml as "
                                                       "written (one you edited), without the registry check."),
           project_dir: Optional[Path] = typer.Option(None, help="Write the rendered prefect.yaml here (default: the "
                                                      "checkout's for the default pool, MLSYS_FLOWS_HOME/deploy/POOL/ "
                                                      "for another; installed, the current folder).")) -> None:
    """Deploy every flow (same as `prefect deploy --all` on the rendered prefect.yaml)."""
    from mlsys_flows.platform.deploy import PREFECT_YAML, DeployError, write_yaml as write, yaml_in_sync
    from mlsys_flows.platform.deploy import deploy as run_deploy

    if write_yaml:
        console.print(f"wrote {write()}")
        return
    if check:
        if not yaml_in_sync():
            fail(f"{PREFECT_YAML} is out of date; run `mlsys-flows deploy --write-yaml`", 1)
        console.print(f"{PREFECT_YAML} matches the registry")
        return
    url = resolve_api_url(api_url)
    configure_prefect_home()
    try:
        with console.status(f"prefect deploy on {url} ..."):
            done = run_deploy(url, names or None, path=prefect_file, pool=pool, image=image, pool_type=pool_type,
                              project_dir=project_dir)
    except DeployError as exc:
        fail(str(exc))
    print_deployed(done, url)


def print_deployed(done: List[str], url: str) -> None:
    """Each deployment with a command that runs it from a fresh shell (this venv's prefect, the API
    named explicitly), on one line even on a narrow terminal: a wrapped command cannot be pasted."""
    import shlex
    import sys as _sys
    from pathlib import Path as _Path

    prefect = shlex.quote(str(_Path(_sys.executable).parent / "prefect"))
    for name in done:
        console.print(f"deployed {name}  (run: PREFECT_API_URL={shlex.quote(url)} {prefect} deployment run "
                      f"{shlex.quote(name)} --param scale=smoke)", highlight=False, soft_wrap=True)

