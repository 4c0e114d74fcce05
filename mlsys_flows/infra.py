"""Work-pool base job templates and Dask cluster specs kept in ``infra/``.

The templates start from Prefect's own defaults (the worker metadata bundled with the server,
the same data ``prefect work-pool get-default-base-job-template`` serves, readable offline) with
mlsys-flows defaults on top: the worker image and resources a flow at ``quick`` scale needs.
``python -m mlsys_flows.infra`` rewrites ``infra/work-pools/*.json``; a test keeps them in sync.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
INFRA = REPO / "infra"

# pool type -> prefect collection in the bundled metadata
POOL_TYPES = {"process": "prefect", "docker": "prefect-docker", "kubernetes": "prefect-kubernetes",
              "ecs": "prefect-aws", "cloud-run": "prefect-gcp", "cloud-run-v2": "prefect-gcp"}
CPU_IMAGE = "mlsys-flows-worker:cpu"   # infra/docker/Dockerfile
CUDA_IMAGE = "mlsys-flows-worker:cuda"  # infra/docker/Dockerfile.cuda
RUN_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DASK_LOGGING__DISTRIBUTED": "warning"}

# variable -> new default, per pool type (only variables Prefect's template declares)
OVERRIDES: dict[str, dict[str, Any]] = {
    "process": {"env": RUN_ENV},
    "docker": {"env": RUN_ENV, "image": CPU_IMAGE, "image_pull_policy": "IfNotPresent", "mem_limit": "8g",
               "auto_remove": True},
    "kubernetes": {"env": RUN_ENV, "image": CPU_IMAGE, "namespace": "mlsys", "cpu_request": "2",
                   "memory_request": "8Gi", "finished_job_ttl": 3600},
    "ecs": {"env": RUN_ENV, "image": CPU_IMAGE, "cpu": 2048, "memory": 8192, "family": "mlsys-flows",
            "configure_cloudwatch_logs": True},
    "cloud-run": {"env": RUN_ENV, "image": CPU_IMAGE, "cpu": "2", "memory": "8Gi", "timeout": 3600},
    "cloud-run-v2": {"env": RUN_ENV, "image": CPU_IMAGE, "cpu": "2000m", "memory": "8Gi", "timeout": 3600},
}
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@lru_cache(maxsize=1)
def _worker_metadata() -> dict[str, Any]:
    spec = importlib.util.find_spec("prefect")
    path = Path(spec.origin).parent / "server/api/collections_data/views/aggregate-worker-metadata.json"
    return json.loads(path.read_text())


def default_job_template(pool_type: str) -> dict[str, Any]:
    """Prefect's default base job template of a worker type (offline)."""
    if pool_type not in POOL_TYPES:
        raise ValueError(f"pool type must be one of {', '.join(POOL_TYPES)} (got {pool_type!r})")
    worker = _worker_metadata()[POOL_TYPES[pool_type]][pool_type]
    return copy.deepcopy(worker["default_base_job_configuration"])


def job_template(pool_type: str) -> dict[str, Any]:
    """Prefect's default with the mlsys-flows defaults applied."""
    template = default_job_template(pool_type)
    props = template["variables"]["properties"]
    for name, value in OVERRIDES.get(pool_type, {}).items():
        if name not in props:
            raise KeyError(f"{pool_type} job template has no variable {name!r}")
        props[name]["default"] = value
    return template


def placeholders(obj: Any) -> set[str]:
    """Every ``{{ variable }}`` a job configuration refers to."""
    if isinstance(obj, dict):
        return set().union(*(placeholders(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(placeholders(v) for v in obj)) if obj else set()
    return set(PLACEHOLDER.findall(obj)) if isinstance(obj, str) else set()


def check_job_template(template: dict[str, Any]) -> list[str]:
    """Problems of a base job template: missing sections, placeholders without a variable,
    defaults of the wrong JSON type. Empty list = valid."""
    problems = [f"missing {key!r}" for key in ("job_configuration", "variables") if key not in template]
    if problems:
        return problems
    variables = template["variables"]
    if variables.get("type") != "object" or not isinstance(variables.get("properties"), dict):
        return ["variables must be a JSON schema of type object with properties"]
    props = variables["properties"]
    problems += [f"placeholder {{{{ {p} }}}} has no variable" for p in sorted(placeholders(template["job_configuration"]))
                 if p not in props and p != "prefect"]
    json_types = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}
    for name, prop in props.items():
        if "default" in prop and prop["default"] is not None and prop.get("type") in json_types:
            if not isinstance(prop["default"], json_types[prop["type"]]):
                problems.append(f"variable {name!r}: default {prop['default']!r} is not a {prop['type']}")
    return problems


def template_path(pool_type: str) -> Path:
    return INFRA / "work-pools" / f"{pool_type}.json"


def write_templates() -> list[Path]:
    paths = []
    for pool_type in POOL_TYPES:
        path = template_path(pool_type)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(job_template(pool_type), indent=2) + "\n")
        paths.append(path)
    return paths


def dask_specs() -> dict[str, Path]:
    """name -> path of every Dask cluster spec in infra/dask/."""
    return {p.stem: p for p in sorted((INFRA / "dask").glob("*.yaml"))}


def load_dask_spec(path: str | Path) -> dict[str, Any]:
    """A cluster spec: the fields of a ``DaskCluster`` block (``cluster_class``, ``cluster_kwargs``, ...)."""
    import yaml

    spec = yaml.safe_load(Path(path).read_text())
    if not isinstance(spec, dict) or "cluster_class" not in spec:
        raise ValueError(f"{path}: a Dask cluster spec is a mapping with cluster_class and cluster_kwargs")
    return spec


if __name__ == "__main__":
    for p in write_templates():
        print(p.relative_to(REPO))
