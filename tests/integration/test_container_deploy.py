"""`mlsys-flows deploy --pool NAME --image IMAGE` for a docker work pool (issue 33): the deployment as
Prefect stores it, rendered by the docker worker's own job configuration (prefect-docker), is what a
container would run: the image, `prefect flow-run execute`, a pull step into the image's WORKDIR, and an
entrypoint that the Dockerfiles put there. (No container runtime runs here: see docs/platform.md.)"""
from __future__ import annotations

import asyncio
from pathlib import PurePosixPath

import pytest
import yaml

from mlsys_flows.platform import deploy, infra

pytest.importorskip("prefect_docker")
from prefect_docker.worker import DockerWorkerJobConfiguration  # noqa: E402

IMAGE = "registry.example/mlsys-flows-worker:cpu"
POOL = "mlsys-docker"
SYSTEM = "recd"


def image_layout(dockerfile: str) -> tuple[str, dict[str, str], str]:
    """(WORKDIR, {path in the image: path in the checkout} of every COPY, Python version) of a Dockerfile."""
    workdir, copies, python = "/", {}, ""
    for line in (infra.REPO / "infra/docker" / dockerfile).read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "WORKDIR":
            workdir = words[1]
        elif words[0] == "COPY":
            *sources, dest = words[1:]
            for src in sources:
                target = PurePosixPath(workdir) / dest
                copies[str(target / src if dest.endswith("/") and len(sources) > 1 else target)] = src
        if "python:" in line and words[0] == "FROM":
            python = words[1].split(":")[1].split("-")[0]
        elif "python3." in line and "apt-get install" in line:
            python = next(w for w in words if w.startswith("python3.")).removeprefix("python")
    return workdir, copies, python


def in_image(path: str, copies: dict[str, str]) -> bool:
    """Whether an absolute path in the image comes from a COPY of an existing checkout path."""
    for target, src in copies.items():
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return (infra.REPO / src / path[len(target):].lstrip("/")).exists()
    return False


def test_both_images_share_workdir_and_python_version():
    cpu, cuda = image_layout("Dockerfile"), image_layout("Dockerfile.cuda")
    assert cpu[0] == cuda[0] == deploy.CONTAINER_WORKDIR
    assert cpu[2] and cpu[2] == cuda[2], f"CPU image Python {cpu[2]}, CUDA image Python {cuda[2]}"


def test_rendered_image_deployments_never_touch_the_committed_prefect_yaml(tmp_path):
    doc = yaml.safe_load(deploy.render(POOL, IMAGE))
    for d in doc["deployments"]:
        assert d["work_pool"] == {"name": POOL, "work_queue_name": "default", "job_variables": {"image": IMAGE}}
        assert d["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": deploy.CONTAINER_WORKDIR}}]
    assert "pull" not in yaml.safe_load(deploy.render())["deployments"][0]  # the process pool: none
    assert deploy.target_file(POOL, IMAGE) != deploy.PREFECT_YAML
    assert deploy.target_file(POOL, IMAGE, tmp_path) == tmp_path / "prefect.yaml"


def test_docker_deployment_renders_to_a_runnable_container(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    assert deploy.deploy(api_url, [SYSTEM], pool=POOL, image=IMAGE, project_dir=tmp_path) == [f"{SYSTEM}/{SYSTEM}"]
    assert yaml.safe_load((tmp_path / "prefect.yaml").read_text()) == deploy.prefect_yaml(POOL, IMAGE)

    async def read():
        async with get_client() as client:
            pool = await client.read_work_pool(POOL)
            dep = await client.read_deployment_by_name(f"{SYSTEM}/{SYSTEM}")
            flow = await client.read_flow(dep.flow_id)
            run = await client.create_flow_run_from_deployment(dep.id)
            # what the docker worker does with a run: its job configuration from the pool's template + the
            # deployment's job variables, prepared for the run
            config = await DockerWorkerJobConfiguration.from_template_and_values(pool.base_job_template,
                                                                                 dep.job_variables)
            config.prepare_for_flow_run(run, dep, flow)
            return pool, dep, run, config

    pool, dep, run, config = asyncio.run(read())
    assert pool.type == "docker"
    assert config.image == IMAGE
    assert config.command.split()[-3:] == ["prefect", "flow-run", "execute"], config.command
    assert config.env["PREFECT__FLOW_RUN_ID"] == str(run.id)
    # in the container, `prefect flow-run execute` runs the pull steps, then loads the entrypoint from there
    assert dep.pull_steps == [{"prefect.deployments.steps.set_working_directory":
                               {"directory": deploy.CONTAINER_WORKDIR}}]
    workdir, copies, _ = image_layout("Dockerfile")
    entry_file = dep.entrypoint.rsplit(":", 1)[0]
    assert dep.entrypoint == f"flows/{SYSTEM}.py:{SYSTEM}"
    assert in_image(str(PurePosixPath(deploy.CONTAINER_WORKDIR) / entry_file), copies), \
        f"{entry_file} is not under the image's WORKDIR {workdir}"
    assert not in_image(str(PurePosixPath("/opt/prefect") / entry_file), copies)  # Prefect's default: not there


def test_deploy_refuses_an_image_on_a_process_pool(prefect_api, tmp_path):
    from prefect.settings import PREFECT_API_URL

    with pytest.raises(deploy.DeployError, match="process"):
        deploy.deploy(PREFECT_API_URL.value(), [SYSTEM], image=IMAGE, pool_type="process", project_dir=tmp_path)
