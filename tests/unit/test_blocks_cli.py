"""`mlsys-flows blocks` without a server: options map onto the block models, a bad value is one line
naming its option (exit 2, before any API is contacted), secrets never show; and the docs' snippets that
save or load a block connect first (tests/integration/test_platform.py runs them against a server)."""
from __future__ import annotations

import re

import pytest
import yaml
from typer.testing import CliRunner

from doc_snippets import REPO, doc_snippets, snippets
from mlsys_flows.blocks import DaskCluster, ObjectStorage, ResourcePool
from mlsys_flows.cli import app
from mlsys_flows.cli.blocks import BlockOptionError, build, check_name, cluster_block, devices_block, storage_block

SECRET = "s3cr3t-never-shown"


def test_storage_options_map_onto_the_block():
    block = storage_block("s3://lab/runs", endpoint_url="http://127.0.0.1:8333", region="us-east-1",
                          access_key_id="AKIA1", secret_access_key=SECRET)
    assert isinstance(block, ObjectStorage)
    assert (block.url, block.endpoint_url, block.region) == ("s3://lab/runs", "http://127.0.0.1:8333", "us-east-1")
    assert block.secret_access_key.get_secret_value() == SECRET
    assert block.max_attempts == ObjectStorage().max_attempts  # an option not given keeps the block's default


def test_cluster_options_override_the_spec():
    spec = yaml.safe_load((REPO / "infra/dask/kubernetes.yaml").read_text())
    block = cluster_block(spec, worker_wait_s=30)
    assert isinstance(block, DaskCluster) and block.mode == "class"
    assert block.cluster_kwargs == spec["cluster_kwargs"] and (block.adapt_min, block.worker_wait_s) == (1, 30)
    local = cluster_block(n_workers=4, processes=False, worker_resources=["GPU=1", "FPGA=0.5"],
                          cluster_secrets={"token": SECRET})
    assert (local.mode, local.n_workers, local.processes) == ("local", 4, False)
    assert local.worker_resources == {"GPU": 1.0, "FPGA": 0.5}
    assert local.cluster_secrets["token"].get_secret_value() == SECRET and SECRET not in repr(local)
    assert cluster_block(address="tcp://10.0.0.5:8786").address == "tcp://10.0.0.5:8786"


def test_devices_pool_is_named_after_the_block_unless_told():
    block = devices_block("lab-gpus", "gpu", ["cuda:0", "cuda:1"])
    assert isinstance(block, ResourcePool)
    assert (block.kind, block.devices, block.name) == ("gpu", ["cuda:0", "cuda:1"], "lab-gpus")
    assert devices_block("lab-gpus", "fpga", ["fpga-sw:0"], per_task=0.5, pool_name="lab").name == "lab"


@pytest.mark.parametrize("make,expected", [
    (lambda: storage_block("http://host/x"), "--url: url must start with file:// or s3://"),
    (lambda: storage_block("s3://lab", timeout_s=0), "--timeout-s: Input should be greater than 0 (got 0)"),
    (lambda: storage_block("s3://lab", secret_access_key=SECRET),
     "ObjectStorage: access_key_id and secret_access_key go together"),
    (lambda: devices_block("lab", "tpu", ["cuda:0"]), "--kind: Input should be 'gpu', 'fpga' or 'cpu' (got 'tpu')"),
    (lambda: devices_block("lab", "gpu", []), "--device: List should have at least 1 item"),
    (lambda: devices_block("lab", "gpu", ["cuda:0"], per_task=0.3), "ResourcePool: per_task must be a whole number"),
    (lambda: devices_block("lab", "gpu", ["cuda:0"], pool_name="Lab"), "--pool-name: String should match pattern"),
    (lambda: cluster_block(address="10.0.0.5:8786"), "--address: address must look like tcp://host:port"),
    (lambda: cluster_block(n_workers=0), "--n-workers: Input should be greater than or equal to 1 (got 0)"),
    (lambda: cluster_block(worker_resources=["GPU"]), "--worker-resource 'GPU': expected NAME=AMOUNT"),
    (lambda: cluster_block(worker_resources=["GPU=one"]), "--worker-resource 'GPU=one': expected NAME=AMOUNT"),
    (lambda: cluster_block({"adapt_mn": 1}, spec_name="--spec k8s.yaml"),
     "--spec k8s.yaml adapt_mn: no DaskCluster field of that name"),
    (lambda: cluster_block({"adapt_min": -1}, spec_name="--spec k8s.yaml"),
     "--spec k8s.yaml adapt_min: Input should be greater than or equal to 0 (got -1)"),
    (lambda: cluster_block({"n_workers": 0}, n_workers=2), None),  # the option overrides the spec's bad value
    (lambda: check_name("Lab_GPUs"), "NAME 'Lab_GPUs': a block name takes lowercase letters, digits and dashes"),
])
def test_a_bad_option_is_one_line_naming_it(make, expected):
    if expected is None:
        make()
        return
    with pytest.raises(BlockOptionError) as exc:
        make()
    message = str(exc.value)
    assert message.startswith(expected), message
    assert "\n" not in message and SECRET not in message


def test_a_secret_field_refused_is_named_without_its_value():
    with pytest.raises(BlockOptionError) as exc:
        build(ObjectStorage, {"url": "s3://lab", "access_key_id": "AKIA1", "secret_access_key": [SECRET]},
              {"secret_access_key": "--secret-access-key-env"})
    assert str(exc.value).startswith("--secret-access-key-env: ") and SECRET not in str(exc.value)


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """The CLI in this process, with the project's home in a temporary folder; connecting to an API fails
    the test (every case here must be refused before)."""
    import mlsys_flows.platform.runner as runner

    for key, value in {"MLSYS_FLOWS_HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect"),
                       "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}.items():
        monkeypatch.setenv(key, value)  # configure_prefect_home's defaults, undone after the test
    monkeypatch.delenv("MISSING_SECRET_VAR", raising=False)
    monkeypatch.setattr(runner, "connect_session", lambda: pytest.fail("connected before refusing the input"))
    return lambda *args, **kw: CliRunner().invoke(app, ["blocks", *args], **kw)


@pytest.mark.parametrize("args,named", [
    (["devices", "lab", "--kind", "tpu", "--device", "cuda:0"], "--kind"),
    (["devices", "Lab", "--kind", "gpu", "--device", "cuda:0"], "NAME 'Lab'"),
    (["storage", "lab", "--url", "s3://b", "--access-key-id", "AKIA1", "--secret-access-key-env", "MISSING_SECRET_VAR"],
     "--secret-access-key-env MISSING_SECRET_VAR"),
    (["cluster", "lab", "--spec", "no-such-file.yaml"], "--spec no-such-file.yaml"),
    (["cluster", "lab", "--cluster-secret-env", "token"], "--cluster-secret-env 'token'"),
    (["secret", "lab", "--env", "A", "--file", "b"], "--env and --file"),
    (["delete", "widget", "lab"], "TYPE 'widget'"),
])
def test_the_command_exits_2_with_one_line_before_connecting(cli, args, named):
    result = cli(*args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], result.output


def test_the_secret_key_is_read_from_stdin_and_never_echoed(cli):
    """No --secret-access-key-env: the key is read from stdin (a hidden prompt on a terminal); the role ARN
    then fails validation, so nothing connects, and the output never holds the key. Nothing piped: refused."""
    result = cli("storage", "lab", "--url", "s3://b", "--access-key-id", "AKIA1", "--role-arn", "role/x",
                 input=SECRET + "\n")
    assert result.exit_code == 2 and "role_arn must be an IAM role ARN" in result.output, result.output
    assert SECRET not in result.output
    empty = cli("storage", "lab", "--url", "s3://b", "--access-key-id", "AKIA1", input="")
    assert empty.exit_code == 2 and "--secret-access-key-env: no S3 secret access key given" in empty.output


def test_snippet_marks_need_a_reason():
    text = ("<!-- snippet: skip (needs a real S3 server) -->\n```python\nA.load('x')\n```\n"
            "```python\nprint('no block')\n```\n"
            "```python\nimport mlsys_flows\nmlsys_flows.connect()\nB().save('y')\n```\n")
    found = snippets(text, "doc.md")
    assert [(s.line, s.skip, s.saved_names()) for s in found] == [(2, "needs a real S3 server", []), (8, None, ["y"])]
    with pytest.raises(ValueError, match="doc.md:1: .* needs a reason"):
        snippets("<!-- snippet: skip -->\n```python\nA.load('x')\n```\n", "doc.md")


def test_every_doc_snippet_that_saves_or_loads_a_block_connects_first():
    """Without `connect()`, Prefect saves into its default profile (~/.prefect), which neither the server
    nor `mlsys-flows run` reads (issue 52)."""
    found = doc_snippets()
    assert {s.path for s in found} == {"README.md", "docs/platform.md"}
    for s in found:
        first_call = re.search(r"\.(save|load)\(", s.code).start()
        connect = re.search(r"^(mlsys_flows\.)?connect\(\)", s.code, re.MULTILINE)
        assert connect and connect.start() < first_call, \
            f"{s.id}: start it with `import mlsys_flows; mlsys_flows.connect()`"
