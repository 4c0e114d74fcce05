"""`mlsys-flows webhooks serve|init|send`: signed webhooks that start deployment runs."""
from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path
from typing import List, Optional

import typer

from mlsys_flows.cli.console import api_url as resolve_api_url, console, fail, warn
from mlsys_flows.settings import configure_prefect_home, home

webhooks_app = typer.Typer(no_args_is_help=True, help="Signed webhooks that start deployment runs.")


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
    from mlsys_flows.integrations.webhooks import (MIN_SECRET_CHARS, WebhookConfig, check as check_hooks,
                                                   configure_logging, create_app, weak_secrets)

    path = config or home() / "hooks.yaml"
    try:
        cfg = WebhookConfig.load(path)
    except ValueError as exc:
        fail(f"{exc} (create one with `mlsys-flows webhooks init`)")
    api = PrefectREST(resolve_api_url(api_url))
    try:  # every hook is signed; a secret short enough to brute-force from one capture counts as none
        weak = weak_secrets(cfg, api)
        warn(check_binding(host, "the webhooks", f"hooks {weak} have secrets under {MIN_SECRET_CHARS} characters"
                            if weak else None, allow_insecure))
        for problem in check_hooks(cfg, api):
            warn(problem)
    except (ValueError, PlatformError) as exc:
        fail(str(exc))
    print_serving(list(cfg.hooks), host, port, api.api_url)
    configure_logging()
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
    """Write a hook per system, each with its own new Secret block (`mlsys-hook-<name>`)."""
    import yaml

    from mlsys_flows import registry

    path = config or home() / "hooks.yaml"
    url = resolve_api_url(api_url)
    names = registry.names()
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
        fail(f"--body must be JSON ({exc.msg} at character {exc.pos}): {body[:80]!r}")
    try:
        cfg = WebhookConfig.load(config or home() / "hooks.yaml")
    except ValueError as exc:
        fail(str(exc))
    if hook not in cfg.hooks:
        fail(f"no hook {hook!r} in the config; hooks: {', '.join(cfg.hooks)}")
    h = cfg.hooks[hook]
    api = PrefectREST(resolve_api_url(api_url))
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

