"""`mlsys-flows blocks`: save, list and delete the project's blocks without writing Python.

Every command works on the API every other command uses (``runner.connect_session``: PREFECT_API_URL,
else the running `mlsys-flows server`, else the project's home), so `mlsys-flows run --devices NAME`
finds what `blocks devices NAME` saved. The builders (``storage_block``, ``cluster_block``,
``devices_block``) map options onto the block model, which validates them before any API is contacted:
a bad value exits 2 with one line naming its option. Secrets are read from an environment variable or
a hidden prompt, never from the command line, and never printed.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer

from mlsys_flows.cli.console import console, fail
from mlsys_flows.errors import MlsysError

blocks_app = typer.Typer(no_args_is_help=True, help="Save, list and delete the Prefect blocks runs use "
                                                    "(--storage, --cluster, --devices).")

# TYPE of `blocks list` and `blocks delete` -> Prefect block type slug
SLUGS = {"storage": "mlsys-object-storage", "checkpoint": "mlsys-checkpoint-store",
         "cluster": "mlsys-dask-cluster", "devices": "mlsys-resource-pool", "secret": "secret"}
BLOCK_NAME = re.compile(r"^[a-z0-9-]+$")  # what Prefect accepts as a block document's name


class BlockOptionError(MlsysError, ValueError):
    """An option the block refuses; the message names the option (one line, no secret)."""


def check_name(name: str) -> str:
    if not BLOCK_NAME.match(name):
        raise BlockOptionError(f"NAME {name!r}: a block name takes lowercase letters, digits and dashes only")
    return name


def build(cls, fields: Dict[str, Any], options: Dict[str, str]):
    """``cls(**fields)`` (None values left out: the block's defaults apply), its first validation error
    as one line naming the option (``options``: field -> option); a secret field's value is never shown."""
    from pydantic import SecretStr, ValidationError

    fields = {k: v for k, v in fields.items() if v is not None}
    unknown = sorted(set(fields) - set(cls.model_fields))
    if unknown:  # a block would keep an unknown key silently (Prefect's blocks allow extra fields)
        raise BlockOptionError(f"{options.get(unknown[0], unknown[0])}: no {cls.__name__} field of that name "
                               f"(its fields: {', '.join(cls.model_fields)})")
    try:
        return cls(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else None
        message = error["msg"].removeprefix("Value error, ")
        if field is None:  # the block's own check of several fields: its message names them
            raise BlockOptionError(f"{cls.__name__}: {message}") from None
        secret = "SecretStr" in str(cls.model_fields[field].annotation) or isinstance(fields.get(field), SecretStr)
        got = "" if secret or error["type"] == "value_error" else f" (got {error.get('input')!r})"
        raise BlockOptionError(f"{options.get(field, field)}: {message}{got}") from None


def storage_block(url: str, endpoint_url: Optional[str] = None, region: Optional[str] = None,
                  access_key_id: Optional[str] = None, secret_access_key: Optional[str] = None,
                  session_token: Optional[str] = None, profile_name: Optional[str] = None,
                  role_arn: Optional[str] = None, max_attempts: Optional[int] = None,
                  timeout_s: Optional[float] = None):
    from mlsys_flows.blocks import ObjectStorage

    fields = dict(url=url, endpoint_url=endpoint_url, region=region, access_key_id=access_key_id,
                  secret_access_key=secret_access_key, session_token=session_token, profile_name=profile_name,
                  role_arn=role_arn, max_attempts=max_attempts, timeout_s=timeout_s)
    return build(ObjectStorage, fields, {**_options(fields), "secret_access_key": "--secret-access-key-env",
                                         "session_token": "--session-token-env"})


def cluster_block(spec: Optional[Dict[str, Any]] = None, address: Optional[str] = None,
                  n_workers: Optional[int] = None, threads_per_worker: Optional[int] = None,
                  processes: Optional[bool] = None, worker_resources: Optional[List[str]] = None,
                  tls_ca_secret: Optional[str] = None, tls_cert_secret: Optional[str] = None,
                  tls_key_secret: Optional[str] = None, worker_wait_s: Optional[float] = None,
                  cluster_secrets: Optional[Dict[str, str]] = None, spec_name: str = "--spec"):
    """A DaskCluster from a spec's fields (infra/dask/*.yaml), each option given overriding its field."""
    from mlsys_flows.blocks import DaskCluster

    given = dict(address=address, n_workers=n_workers, threads_per_worker=threads_per_worker, processes=processes,
                 tls_ca_secret=tls_ca_secret, tls_cert_secret=tls_cert_secret, tls_key_secret=tls_key_secret,
                 worker_wait_s=worker_wait_s,
                 worker_resources=_pairs(worker_resources, "--worker-resource") if worker_resources else None,
                 cluster_secrets=cluster_secrets or None)
    given = {k: v for k, v in given.items() if v is not None}
    names = {**{k: f"{spec_name} {k}" for k in spec or {}},
             **{k: {"worker_resources": "--worker-resource", "cluster_secrets": "--cluster-secret-env"}.get(k, o)
                for k, o in _options(given).items()}}
    return build(DaskCluster, {**(spec or {}), **given}, names)


def devices_block(name: str, kind: str, devices: List[str], per_task: Optional[float] = None,
                  pool_name: Optional[str] = None, claim_timeout_s: Optional[float] = None):
    """A ResourcePool; its pool name (its Prefect concurrency limit's) defaults to the block's name, so two
    pools saved from the command line never share a limit."""
    from mlsys_flows.blocks import ResourcePool

    fields = dict(kind=kind, devices=list(devices), per_task=per_task, name=pool_name or name,
                  claim_timeout_s=claim_timeout_s)
    return build(ResourcePool, fields, {**_options(fields), "devices": "--device", "name": "--pool-name"})


def _options(fields: Dict[str, Any]) -> Dict[str, str]:
    return {k: "--" + k.replace("_", "-") for k in fields}


def _pairs(items: List[str], option: str) -> Dict[str, float]:
    """``["GPU=1", ...]`` -> ``{"GPU": 1.0}``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            amount = float(value) if sep and key.strip() else None
        except ValueError:
            amount = None
        if amount is None:
            raise BlockOptionError(f"{option} {item!r}: expected NAME=AMOUNT, e.g. GPU=1")
        out[key.strip()] = amount
    return out


def read_secret(option: str, env: Optional[str], what: str, prompt: bool = True,
                whole: bool = False) -> Optional[str]:
    """A secret from the environment variable ``env`` names, else, when ``prompt``, typed at a hidden
    prompt or piped on stdin (its first line; all of it when ``whole``: a PEM); never from the command
    line, where shell history and `ps` would keep it."""
    if env:
        value = os.environ.get(env)
        if not value:
            raise BlockOptionError(f"{option} {env}: that environment variable is not set (or empty)")
        return value
    if not prompt:
        return None
    if sys.stdin.isatty():
        return typer.prompt(what, hide_input=True)
    value = (sys.stdin.read() if whole else sys.stdin.readline()).rstrip("\r\n")
    if not value:
        raise BlockOptionError(f"{option}: no {what} given (pipe it on stdin, or name a variable holding it)")
    return value


def describe(block) -> str:
    """What was saved, in a few words, without a secret."""
    kind = type(block).__name__
    if kind == "ObjectStorage":
        if not block.url.startswith("s3://"):
            return block.url or "the project's storage folder"
        keys = "static keys" if block.access_key_id else (f"profile {block.profile_name}" if block.profile_name
                                                         else "the default AWS credentials")
        return ", ".join([block.url, *([f"endpoint {block.endpoint_url}"] if block.endpoint_url else []), keys])
    if kind == "DaskCluster":
        if block.mode == "address":
            return f"scheduler {block.address}"
        if block.mode == "class":
            return f"cluster class {block.cluster_class}"
        return f"embedded LocalCluster, {block.n_workers} workers x {block.threads_per_worker} threads"
    if kind == "ResourcePool":
        return f"{block.kind} {', '.join(block.devices)}, {block.per_task:g} per task, pool {block.name}"
    return "value hidden"


def _where(url: str) -> str:
    from mlsys_flows.platform.server import embedded_api

    if embedded_api() is not None:
        return f"the project's home ({os.environ['PREFECT_HOME']}, no server running)"
    return url


def _connect() -> str:
    """The API (see the module's docstring) and how to name it in the line a command prints."""
    from mlsys_flows.platform.runner import connect_session

    try:
        return _where(connect_session())
    except MlsysError as exc:  # the embedded API did not start (its log's tail), or a settings context
        fail(str(exc), code=1)


def _guarded(make):
    """``make()``, its BlockOptionError as one line and exit 2. First keeps Prefect's home in the project's
    (``make`` imports prefect, which reads it once)."""
    from mlsys_flows.settings import configure_prefect_home

    configure_prefect_home()
    try:
        return make()
    except BlockOptionError as exc:
        fail(str(exc))


def _save(block, name: str, overwrite: bool) -> None:
    """Save into the API; one line saying what went where. A name in use exits 2 unless ``overwrite``."""
    from prefect.exceptions import ObjectAlreadyExists

    where = _connect()
    slug = block.get_block_type_slug()
    try:
        block.save(name, overwrite=overwrite)
    except ValueError as exc:
        if isinstance(exc.__cause__, ObjectAlreadyExists):
            fail(f"NAME {name!r}: a {slug} block of that name exists on {where}; --overwrite replaces it")
        raise
    console.print(f"saved {slug} {name!r} ({describe(block)}) to {where}", highlight=False, soft_wrap=True)


OVERWRITE = typer.Option(False, "--overwrite", help="Replace a block of the same type and name.")
NAME = typer.Argument(..., help="Block name (lowercase letters, digits, dashes): what --storage, --cluster or "
                                "--devices take.")


@blocks_app.command("storage")
def blocks_storage(name: str = NAME,
                   url: str = typer.Option(..., help="file:///path or s3://bucket/prefix."),
                   endpoint_url: Optional[str] = typer.Option(None, help="S3 endpoint, e.g. http://127.0.0.1:8333 "
                                                              "(SeaweedFS, MinIO); none for AWS."),
                   region: Optional[str] = typer.Option(None, help="S3 region, e.g. us-east-1."),
                   access_key_id: Optional[str] = typer.Option(None, help="S3 access key id; its secret key "
                                                               "then comes from --secret-access-key-env or a "
                                                               "hidden prompt."),
                   secret_access_key_env: Optional[str] = typer.Option(None, help="Environment variable holding the "
                                                                       "secret access key (default: prompt for it)."),
                   session_token_env: Optional[str] = typer.Option(None, help="Environment variable holding the "
                                                                   "session token of temporary keys."),
                   profile_name: Optional[str] = typer.Option(None, help="AWS profile to take credentials from."),
                   role_arn: Optional[str] = typer.Option(None, help="IAM role to assume with those credentials."),
                   overwrite: bool = OVERWRITE) -> None:
    """Save an ObjectStorage block: a folder or an S3 bucket/prefix for reports, checkpoints and results."""
    def make():
        check_name(name)
        secret = read_secret("--secret-access-key-env", secret_access_key_env, "S3 secret access key",
                             prompt=bool(access_key_id))
        token = read_secret("--session-token-env", session_token_env, "session token", prompt=False)
        return storage_block(url, endpoint_url=endpoint_url, region=region, access_key_id=access_key_id,
                             secret_access_key=secret, session_token=token, profile_name=profile_name,
                             role_arn=role_arn)

    _save(_guarded(make), name, overwrite)


@blocks_app.command("cluster")
def blocks_cluster(name: str = NAME,
                   address: Optional[str] = typer.Option(None, help="A running scheduler, tcp://host:8786 "
                                                         "(tls:// with the --tls-* secrets)."),
                   spec: Optional[Path] = typer.Option(None, help="YAML of the block's fields, e.g. "
                                                       "infra/dask/kubernetes.yaml; options given override it."),
                   n_workers: Optional[int] = typer.Option(None, help="Workers of an embedded LocalCluster."),
                   threads_per_worker: Optional[int] = typer.Option(None, help="Threads per embedded worker."),
                   processes: Optional[bool] = typer.Option(None, "--processes/--threads", help="Embedded workers "
                                                            "as processes or as threads of the run's process."),
                   worker_resource: List[str] = typer.Option([], help="NAME=AMOUNT each embedded worker "
                                                             "advertises, e.g. GPU=1 (repeatable)."),
                   tls_ca_secret: Optional[str] = typer.Option(None, help="Secret block holding the TLS CA."),
                   tls_cert_secret: Optional[str] = typer.Option(None, help="Secret block holding the client "
                                                                 "certificate."),
                   tls_key_secret: Optional[str] = typer.Option(None, help="Secret block holding the client key."),
                   worker_wait_s: Optional[float] = typer.Option(None, help="Longest a run with devices waits "
                                                                 "for a worker advertising them."),
                   cluster_secret_env: List[str] = typer.Option([], help="KWARG=ENV_VAR: a secret keyword argument "
                                                                "of the cluster class (a cloud token) read from "
                                                                "that variable (repeatable)."),
                   overwrite: bool = OVERWRITE) -> None:
    """Save a DaskCluster block: where a run's tasks go (an address, a cluster class, or the embedded one)."""
    def make():
        check_name(name)
        fields = _read_spec(spec) if spec else None
        secrets = {}
        for item in cluster_secret_env:
            kwarg, sep, env = item.partition("=")
            if not sep or not kwarg or not env:
                raise BlockOptionError(f"--cluster-secret-env {item!r}: expected KWARG=ENV_VAR, "
                                       f"e.g. token=COILED_TOKEN")
            secrets[kwarg] = read_secret("--cluster-secret-env", env, kwarg, prompt=False)
        return cluster_block(fields, address=address, n_workers=n_workers, threads_per_worker=threads_per_worker,
                             processes=processes, worker_resources=worker_resource, tls_ca_secret=tls_ca_secret,
                             tls_cert_secret=tls_cert_secret, tls_key_secret=tls_key_secret,
                             worker_wait_s=worker_wait_s, cluster_secrets=secrets, spec_name=f"--spec {spec}")

    _save(_guarded(make), name, overwrite)


def _read_spec(path: Path) -> Dict[str, Any]:
    import yaml

    try:
        fields = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BlockOptionError(f"--spec {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(fields, dict):
        raise BlockOptionError(f"--spec {path}: expected a mapping of DaskCluster fields")
    return fields


@blocks_app.command("devices")
def blocks_devices(name: str = NAME,
                   kind: str = typer.Option(..., help="gpu, fpga or cpu."),
                   device: List[str] = typer.Option([], help="A device as the worker sees it: cuda:0, fpga-sw:0 "
                                                     "(repeat it for each)."),
                   per_task: Optional[float] = typer.Option(None, help="Devices one task claims: a whole number, or "
                                                            "a share 1/k of one (0.5)."),
                   pool_name: Optional[str] = typer.Option(None, help="Name of the pool's Prefect concurrency limit "
                                                           "(mlsys-KIND-NAME); default: the block's name."),
                   claim_timeout_s: Optional[float] = typer.Option(None, help="Longest a claim waits for a device."),
                   overwrite: bool = OVERWRITE) -> None:
    """Save a ResourcePool block: the devices (GPUs, FPGAs, CPU slots) a run's device tasks claim."""
    block = _guarded(lambda: devices_block(check_name(name), kind, device, per_task=per_task, pool_name=pool_name,
                                           claim_timeout_s=claim_timeout_s))
    _save(block, name, overwrite)


@blocks_app.command("secret")
def blocks_secret(name: str = NAME,
                  env: Optional[str] = typer.Option(None, help="Environment variable holding the value."),
                  file: Optional[Path] = typer.Option(None, help="File holding the value (a PEM, a token)."),
                  overwrite: bool = OVERWRITE) -> None:
    """Save a Prefect Secret block (a webhook's secret, a TLS certificate or key): from a variable, a file,
    a hidden prompt or stdin."""
    def make():
        check_name(name)
        if env and file:
            raise BlockOptionError("--env and --file: give one")
        if file:
            try:
                return file.read_text()
            except OSError as exc:
                raise BlockOptionError(f"--file {file}: {exc.strerror}") from None
        return read_secret("--env", env, "secret value", whole=True)

    value = _guarded(make)
    from prefect.blocks.system import Secret

    _save(Secret(value=value), name, overwrite)


@blocks_app.command("list")
def blocks_list() -> None:
    """List the saved blocks of the project's types (and Secrets): TYPE and NAME, one a line."""
    where = _connect()
    import httpx
    from prefect import get_client

    rows = []
    with get_client(sync_client=True) as client:
        for kind, slug in SLUGS.items():
            try:
                docs = client.read_block_documents_by_type(slug, include_secrets=False)
            except httpx.HTTPStatusError as exc:  # 404: the type is not registered there yet
                if exc.response.status_code != 404:
                    raise
                docs = []
            rows += [(kind, doc.name) for doc in docs if doc.name and not doc.is_anonymous]
    if not rows:
        console.print(f"no saved blocks on {where}", highlight=False, soft_wrap=True)
    for kind, name in sorted(rows):
        console.print(f"{kind:<11}{name}", highlight=False, soft_wrap=True)


@blocks_app.command("delete")
def blocks_delete(kind: str = typer.Argument(..., metavar="TYPE", help=", ".join(SLUGS) + "."),
                  name: str = typer.Argument(..., help="Block name.")) -> None:
    """Delete a saved block (`prefect block delete`, for the project's types)."""
    slug = SLUGS.get(kind) or (kind if kind in SLUGS.values() else None)
    if slug is None:
        fail(f"TYPE {kind!r}: one of {', '.join(SLUGS)}")
    where = _connect()
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    # through the client: ObjectStorage.delete(key) deletes a stored object, not the block
    with get_client(sync_client=True) as client:
        try:
            doc = client.read_block_document_by_name(name, block_type_slug=slug, include_secrets=False)
        except ObjectNotFound:
            fail(f"NAME {name!r}: no {slug} block of that name on {where}")
        client.delete_block_document(doc.id)
    console.print(f"deleted {slug} {name!r} from {where}", highlight=False, soft_wrap=True)


@blocks_app.command("register")
def blocks_register() -> None:
    """Register the block types with the Prefect API (like `prefect block register -m mlsys_flows.blocks`)."""
    where = _connect()
    from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool

    for block in (ObjectStorage, CheckpointStore, DaskCluster, ResourcePool):
        block.register_type_and_schema()
        console.print(f"registered {block.get_block_type_slug()} on {where}", highlight=False, soft_wrap=True)
