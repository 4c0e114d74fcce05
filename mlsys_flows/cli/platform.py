"""CLI commands of the orchestration platform: `server`, `deploy`, `webhooks ...`."""
from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console, ConsoleDimensions

from mlsys_flows.settings import configure_prefect_home, home

PIPE_WIDTH = 10_000


class PipeConsole(Console):
    """A rich console that wraps nothing when its output is not a terminal (a pipe, a file, a CI log),
    where rich would wrap at $COLUMNS or 80 and split commands, URLs and names across lines; on a
    terminal, its real width. Tables then take their natural width."""

    def _size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

    size = property(_size, Console.size.fset)


console = PipeConsole()
err = PipeConsole(stderr=True)
webhooks_app = typer.Typer(no_args_is_help=True, help="Signed webhooks that start deployment runs.")


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _warn(message: Optional[str]) -> None:
    if message:
        err.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


def _api_url(explicit: Optional[str]) -> str:
    from mlsys_flows.platform.server import discover_api_url

    url = explicit or discover_api_url()
    if not url:
        _fail("no Prefect API: start `mlsys-flows server` (another terminal) or set PREFECT_API_URL")
    return url


def server(host: str = typer.Option("127.0.0.1", help="Interface to bind (keep 127.0.0.1 unless behind a proxy)."),
           port: int = typer.Option(4200, help="API and UI port."),
           worker: bool = typer.Option(True, help="Start a process worker for the mlsys-process work pool."),
           worker_query_seconds: float = typer.Option(5.0, min=1, max=60, help="How often the worker polls."),
           warm_cluster: bool = typer.Option(True, help="Start a Dask cluster with the flows imported; runs "
                                                        "without --cluster attach to it."),
           allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Bind a non-loopback --host without "
                                               "PREFECT_SERVER_API_AUTH_STRING (warns; default: refuse).")) -> None:
    """Start a local Prefect server, the mlsys-process work pool, a worker, and register the blocks.

    SQLite under the data folder (MLSYS_FLOWS_HOME/server/), or PostgreSQL when
    PREFECT_API_DATABASE_CONNECTION_URL is set. Ctrl-C stops everything.
    """
    configure_prefect_home()
    from mlsys_flows.platform.server import LocalPlatform, PlatformError, check_binding, serve_forever, server_missing_auth

    try:
        _warn(check_binding(host, "the Prefect API and UI", server_missing_auth(), allow_insecure))
        serve_forever(LocalPlatform(host=host, port=port, worker=worker, worker_query_s=worker_query_seconds,
                                    warm_cluster=warm_cluster),
                      echo=lambda m: console.print(m, highlight=False, soft_wrap=True))
    except PlatformError as exc:
        _fail(str(exc))


def deploy(names: Optional[List[str]] = typer.Argument(None, help="Systems to deploy (default: all implemented)."),
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
    """Deploy every implemented flow (same as `prefect deploy --all` on the rendered prefect.yaml)."""
    from mlsys_flows.platform.deploy import PREFECT_YAML, DeployError, write_yaml as write, yaml_in_sync
    from mlsys_flows.platform.deploy import deploy as run_deploy

    if write_yaml:
        console.print(f"wrote {write()}")
        return
    if check:
        if not yaml_in_sync():
            _fail(f"{PREFECT_YAML} is out of date; run `mlsys-flows deploy --write-yaml`", 1)
        console.print(f"{PREFECT_YAML} matches the registry")
        return
    url = _api_url(api_url)
    configure_prefect_home()
    try:
        with console.status(f"prefect deploy on {url} ..."):
            done = run_deploy(url, names or None, path=prefect_file, pool=pool, image=image, pool_type=pool_type,
                              project_dir=project_dir)
    except DeployError as exc:
        _fail(str(exc))
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


@webhooks_app.command("serve")
def webhooks_serve(config: Path = typer.Option(None, help="Hook config (YAML/JSON); default MLSYS_FLOWS_HOME/hooks.yaml."),
                   host: str = typer.Option("127.0.0.1", help="Interface to bind."),
                   port: int = typer.Option(8765, help="Port."),
                   api_url: Optional[str] = typer.Option(None, help="Prefect API (default: PREFECT_API_URL or the "
                                                                   "running `mlsys-flows server`)."),
                   allow_insecure: bool = typer.Option(False, "--allow-insecure", help="Bind a non-loopback --host "
                                                       "although a hook's secret is weak (warns; default: refuse).")) -> None:
    """Serve POST /hooks/{name}: a signed request starts a run of the hook's deployment."""
    import uvicorn

    from mlsys_flows.platform.prefect_rest import PrefectREST
    from mlsys_flows.platform.server import PlatformError, check_binding
    from mlsys_flows.integrations.webhooks import MIN_SECRET_CHARS, WebhookConfig, check as check_hooks, create_app, weak_secrets

    path = config or home() / "hooks.yaml"
    try:
        cfg = WebhookConfig.load(path)
    except ValueError as exc:
        _fail(f"{exc} (create one with `mlsys-flows webhooks init`)")
    api = PrefectREST(_api_url(api_url))
    try:  # every hook is signed; a secret short enough to brute-force from one capture counts as none
        weak = weak_secrets(cfg, api)
        _warn(check_binding(host, "the webhooks", f"hooks {weak} have secrets under {MIN_SECRET_CHARS} characters"
                            if weak else None, allow_insecure))
        for problem in check_hooks(cfg, api):
            _warn(problem)
    except (ValueError, PlatformError) as exc:
        _fail(str(exc))
    print_serving(list(cfg.hooks), host, port, api.api_url)
    uvicorn.run(create_app(cfg, api), host=host, port=port, log_level="info")


def print_serving(hooks: List[str], host: str, port: int, api_url: str) -> None:
    """What `webhooks serve` listens on: a line per hook (a list of 27 names on one line wrapped
    mid-name), each URL whole."""
    console.print(f"webhooks ({len(hooks)}) -> Prefect API {api_url}:", highlight=False, soft_wrap=True)
    for name in hooks:
        console.print(f"  POST http://{host}:{port}/hooks/{name}", highlight=False, soft_wrap=True)


@webhooks_app.command("init")
def webhooks_init(config: Path = typer.Option(None, help="Where to write the config; default MLSYS_FLOWS_HOME/hooks.yaml."),
                  api_url: Optional[str] = typer.Option(None, help="Prefect API for the Secret blocks.")) -> None:
    """Write a hook per implemented system, each with its own new Secret block (`mlsys-hook-<name>`)."""
    import yaml

    from mlsys_flows import registry

    path = config or home() / "hooks.yaml"
    url = _api_url(api_url)
    names = [s.name for s in registry.implemented()]
    if not names:
        _fail("no system is implemented yet")
    hooks = {}
    for name in names:
        block = f"mlsys-hook-{name}"
        _save_secret(url, block, secrets.token_urlsafe(32), overwrite=False)
        hooks[name] = {"system": name, "deployment": f"{name}/{name}", "secret_block": block,
                       "template": {"scale": "{{ body.scale }}", "overrides": "{{ body.overrides }}"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"tolerance_s": 300, "max_body_bytes": 65536, "hooks": hooks}, sort_keys=False))
    console.print(f"wrote {path} ({len(hooks)} hooks; secrets in Prefect Secret blocks mlsys-hook-<name>)")


def _save_secret(api_url: str, block: str, value: str, overwrite: bool) -> bool:
    """Save a Secret block unless one exists (and not ``overwrite``). Returns True when written."""
    configure_prefect_home()
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        if not overwrite:
            try:
                Secret.load(block)
                return False
            except ValueError:
                pass
        Secret(value=value).save(block, overwrite=True)
    return True


@webhooks_app.command("send")
def webhooks_send(hook: str = typer.Argument(..., help="Hook name."),
                  body: str = typer.Option("{}", help="JSON body, e.g. '{\"scale\": \"smoke\"}'."),
                  url: str = typer.Option("http://127.0.0.1:8765", help="Base URL of `webhooks serve`."),
                  config: Path = typer.Option(None, help="Hook config holding the hook's secret reference."),
                  delivery: Optional[str] = typer.Option(None, help="Delivery id (default: a new uuid)."),
                  wait: bool = typer.Option(False, help="Wait for the run's final state."),
                  api_url: Optional[str] = typer.Option(None, help="Prefect API (to read the secret, and --wait).")) -> None:
    """Sign a body with the hook's secret and POST it (a test sender; see docs/platform.md for curl)."""
    import os

    import httpx

    from mlsys_flows.platform.prefect_rest import PrefectREST
    from mlsys_flows.integrations.webhooks import WebhookConfig, signed_headers

    try:  # before any config or API is read
        payload = json.dumps(json.loads(body)).encode()
    except json.JSONDecodeError as exc:
        _fail(f"--body must be JSON ({exc.msg} at character {exc.pos}): {body[:80]!r}")
    try:
        cfg = WebhookConfig.load(config or home() / "hooks.yaml")
    except ValueError as exc:
        _fail(str(exc))
    if hook not in cfg.hooks:
        _fail(f"no hook {hook!r} in the config; hooks: {', '.join(cfg.hooks)}")
    h = cfg.hooks[hook]
    api = PrefectREST(_api_url(api_url))
    secret = api.read_secret(h.secret_block) if h.secret_block else os.environ.get(h.secret_env or "", "")
    response = httpx.post(f"{url.rstrip('/')}/hooks/{hook}", content=payload, timeout=30,
                          headers=signed_headers(secret, payload, delivery or uuid.uuid4().hex))
    console.print(f"HTTP {response.status_code} {response.text}", highlight=False)
    if response.status_code != 202:
        raise typer.Exit(1)
    if wait:
        run_id = response.json()["flow_run_id"]
        with console.status(f"waiting for flow run {run_id} ..."):
            final = api.wait_for_final_state(run_id)
        console.print(f"flow run {final['name']}: {final['state']['type']}")
        if final["state"]["type"] != "COMPLETED":
            raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the platform commands to the main CLI."""
    app.command()(server)
    app.command()(deploy)
    app.add_typer(webhooks_app, name="webhooks")
