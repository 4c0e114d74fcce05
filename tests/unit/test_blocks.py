"""Block standards and local behaviour of ObjectStorage, CheckpointStore, DaskCluster, ResourcePool."""
import logging
import os

import pyarrow as pa
import pytest
import torch

from mlsys_flows.blocks import CheckpointStore, DaskCluster, ObjectStorage, ResourcePool, StorageError
from storage_keys import KEY_METHODS, assert_refused_everywhere

BLOCKS = [ObjectStorage, CheckpointStore, DaskCluster, ResourcePool]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.__name__)
def test_block_standards(block):
    for name, field in block.model_fields.items():
        assert field.description, f"{block.__name__}.{name} has no description"
    doc = block.__doc__ or ""
    assert ".load(" in doc and "Example" in doc, f"{block.__name__} docstring lacks a .load() example"
    assert block.get_block_type_slug().startswith("mlsys-")


def test_storage_roundtrip(local_storage):
    local_storage.write_bytes("a/b.bin", b"xyz")
    local_storage.write_json("a/c.json", {"k": [1, 2]})
    table = pa.table({"x": list(range(100)), "y": [str(i) for i in range(100)]})
    n = local_storage.write_parquet("a/d.parquet", table)
    assert n == local_storage.size("a/d.parquet") > 0
    assert local_storage.read_bytes("a/b.bin") == b"xyz"
    assert local_storage.read_json("a/c.json") == {"k": [1, 2]}
    assert local_storage.read_parquet("a/d.parquet", columns=["x"]).column_names == ["x"]
    assert local_storage.list("a") == ["a/b.bin", "a/c.json", "a/d.parquet"]
    local_storage.delete("a/b.bin")
    assert not local_storage.exists("a/b.bin")


def test_storage_rejects_bad_urls_and_keys(tmp_path):
    with pytest.raises(ValueError, match="url"):
        ObjectStorage(url="ftp://host/x")
    with pytest.raises(ValueError, match="bucket"):
        ObjectStorage(url="s3://")
    with pytest.raises(StorageError, match="does not exist"):
        ObjectStorage(url=(tmp_path / "no" / "such" / "dir").as_uri()).check()
    store = ObjectStorage(url=tmp_path.as_uri())
    with pytest.raises(StorageError, match="invalid storage key"):
        store.write_bytes("../escape", b"x")
    with pytest.raises(StorageError, match="no object"):
        store.read_bytes("missing")


@pytest.mark.parametrize("method", sorted(KEY_METHODS))
def test_every_key_method_refuses_keys_leaving_the_root(tmp_path, method):
    """Issue 35: `list("..")` listed the root's parent; now every key-taking method refuses."""
    (tmp_path / "outside.bin").write_bytes(b"secret")  # a sibling of the root that must stay unseen
    store = ObjectStorage(url=(tmp_path / "root").as_uri()).check()
    store.write_bytes("a/inside.bin", b"x")
    assert_refused_everywhere(store, method)
    assert (tmp_path / "outside.bin").read_bytes() == b"secret"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside.bin", "root"]
    assert store.list() == ["a/inside.bin"]  # an empty prefix is the whole root


def test_interrupted_local_write_leaves_no_final_object(local_storage, monkeypatch):
    """A crash between the temporary write and the move leaves nothing under the final key."""
    def crash(*a, **k):
        raise OSError("simulated crash before commit")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StorageError, match="simulated crash"):
        local_storage.write_bytes("final.bin", b"x" * 1000)
    monkeypatch.undo()
    assert not local_storage.exists("final.bin")
    assert local_storage.list() == []  # the temporary file was removed too


def test_checkpoint_keep_last_resume_and_corruption(local_storage, caplog):
    store = CheckpointStore(storage=local_storage, keep_last=2)
    assert store.resume("run", default={"fresh": True}) == (-1, {"fresh": True})
    for step in range(4):
        store.write("run", step, {"w": torch.full((3,), float(step)), "meta": {"step": step, "tags": ["a"]}})
    assert [e["step"] for e in store.manifest("run")] == [2, 3]
    assert len([k for k in local_storage.list("checkpoints/run") if k.endswith(".pt")]) == 2
    step, state = store.resume("run")
    assert step == 3 and torch.equal(state["w"], torch.full((3,), 3.0)) and state["meta"]["tags"] == ["a"]

    # flip bytes in the newest blob: it is detected by checksum and skipped with a warning
    key = store.manifest("run")[-1]["key"]
    blob = bytearray(local_storage.read_bytes(key))
    blob[len(blob) // 2] ^= 0xFF
    local_storage.write_bytes(key, bytes(blob))
    with caplog.at_level(logging.WARNING, logger="mlsys_flows.checkpoint"):
        step, state = store.resume("run")
    assert step == 2 and float(state["w"][0]) == 2.0
    assert "checksum" in caplog.text
    assert store.latest("run")["step"] == 2
    with pytest.raises(StorageError):
        store.restore("run", step=3)  # never loads the corrupted one


def test_checkpoint_rejects_bad_run_key(local_storage):
    with pytest.raises(ValueError, match="run_key"):
        CheckpointStore(storage=local_storage).write("a/b", 0, {})


def test_dask_cluster_modes():
    local = DaskCluster()
    assert local.mode == "local"
    runner = local.task_runner()
    assert runner.cluster_kwargs["n_workers"] == 2 and runner.cluster_kwargs["dashboard_address"] is None
    assert DaskCluster(address="tcp://127.0.0.1:8786").task_runner().address == "tcp://127.0.0.1:8786"
    with pytest.raises(ValueError, match="address"):
        DaskCluster(address="127.0.0.1:8786")
    with pytest.raises(ValueError, match="cluster_class"):
        DaskCluster(cluster_class="no_such_pkg.Cluster").task_runner()
    custom = DaskCluster(cluster_class="distributed.LocalCluster", cluster_kwargs={"n_workers": 1})
    assert custom.task_runner().cluster_kwargs == {"n_workers": 1}


def test_resource_pool(caplog):
    pool = ResourcePool(kind="gpu", devices=["cuda:0", "cuda:1"], name="lab")
    assert pool.worker_resources() == {"GPU": 2.0}
    assert pool.concurrency_limit_name == "mlsys-gpu-lab"
    with pytest.raises(ValueError, match="per_task"):
        ResourcePool(kind="gpu", devices=["cuda:0"], per_task=2)
    if not torch.cuda.is_available():
        with caplog.at_level(logging.WARNING, logger="mlsys_flows.resources"):
            assert pool.device() == "cpu"
        assert "falling back to CPU" in caplog.text
    assert ResourcePool(kind="fpga", devices=["fpga:0"]).device() == "fpga-sw:0"
    import dask

    with pool.annotate():
        assert dask.get_annotations()["resources"] == {"GPU": 1.0}


# ----- Block's own API is not shadowed ---------------------------------------------------------------
# ObjectStorage.delete(key) deletes a stored object and so hides Block.delete(name) (deleting a saved
# block document: use `prefect block delete` or Block's client). Renaming it touches systems/checkpoint.
SHADOW_KNOWN = {("ObjectStorage", "delete")}


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.__name__)
def test_no_block_method_shadows_one_of_blocks_own(block):
    """A method of the same name as one of Block's (``load``, ``save``, ...) hides it: before the
    checkpoint methods were renamed, ``CheckpointStore.load("NAME")`` called ``load(run_key, step)``."""
    from prefect.blocks.core import Block
    from pydantic import BaseModel

    own = {name for cls in block.__mro__ if cls.__module__.startswith("mlsys_flows") for name in vars(cls)}
    shadowed = {name for name in own if not name.startswith("_") and hasattr(Block, name)
                and not hasattr(BaseModel, name)} - {n for b, n in SHADOW_KNOWN if b == block.__name__}
    assert not shadowed, f"{block.__name__} shadows Block.{', Block.'.join(sorted(shadowed))}"


def test_checkpoint_store_load_is_blocks_classmethod():
    from prefect.blocks.core import Block

    assert CheckpointStore.load.__func__ is Block.load.__func__
    assert CheckpointStore.save is Block.save


# ----- S3 credentials through boto's session chain --------------------------------------------------------
@pytest.fixture
def aws_env(tmp_path, monkeypatch):
    """No AWS configuration but the files written here: the host's ~/.aws and AWS_* are out of reach,
    and no request goes to an instance-metadata endpoint. Returns the config file's path."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    config, shared = tmp_path / "aws-config", tmp_path / "aws-credentials"
    config.write_text("")
    shared.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(shared))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return config


def _resolve(storage: ObjectStorage):
    """(method, access key, secret key, token) of the credentials the storage's session resolves."""
    import asyncio

    async def go():
        creds = await storage.aws_session().get_credentials()
        if creds is None:
            return None
        frozen = await creds.get_frozen_credentials()
        return creds.method, frozen.access_key, frozen.secret_key, frozen.token

    return asyncio.run(go())


S3 = {"url": "s3://bucket/prefix", "region": "us-east-1"}


def test_static_keys_with_a_session_token(aws_env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")  # given keys win over the environment
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    storage = ObjectStorage(**S3, access_key_id="AKIDTEMP", secret_access_key="tempsecret", session_token="tok-123")
    assert _resolve(storage) == ("explicit", "AKIDTEMP", "tempsecret", "tok-123")
    assert "tok-123" not in repr(storage) and "tempsecret" not in repr(storage)


def test_profile_from_the_aws_config_file(aws_env):
    aws_env.write_text("[profile research]\naws_access_key_id = PROFKEY\naws_secret_access_key = profsecret\n"
                       "aws_session_token = proftoken\n")
    assert _resolve(ObjectStorage(**S3, profile_name="research")) == ("config-file", "PROFKEY", "profsecret", "proftoken")


def test_nothing_given_is_the_default_chain(aws_env, monkeypatch):
    assert _resolve(ObjectStorage(**S3)) is None  # nothing configured anywhere: no credentials
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    assert _resolve(ObjectStorage(**S3)) == ("env", "ENVKEY", "envsecret", None)


def test_an_unknown_profile_fails_naming_it(aws_env):
    from botocore.exceptions import ProfileNotFound

    with pytest.raises(ProfileNotFound, match="nope"):
        _resolve(ObjectStorage(**S3, profile_name="nope"))


class _STS:
    """A stand-in STS endpoint on 127.0.0.1: answers AssumeRole with fixed role credentials and
    records each request (its form fields and the access key that signed it)."""

    XML = ("<AssumeRoleResponse xmlns='https://sts.amazonaws.com/doc/2011-06-15/'><AssumeRoleResult><Credentials>"
           "<AccessKeyId>ASIAROLE</AccessKeyId><SecretAccessKey>rolesecret</SecretAccessKey>"
           "<SessionToken>roletoken</SessionToken><Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>"
           "<AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/mlsys/mlsys-flows</Arn>"
           "<AssumedRoleId>AROA1:mlsys-flows</AssumedRoleId></AssumedRoleUser></AssumeRoleResult>"
           "<ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleResponse>")

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qs

        requests = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                signer = self.headers.get("Authorization", "").split("Credential=")[-1].split("/")[0]
                requests.append({**{k: v[0] for k, v in parse_qs(body).items()}, "signed_by": signer})
                data = _STS.XML.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        import threading

        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


ROLE = "arn:aws:iam::123456789012:role/mlsys"


@pytest.mark.parametrize("source,signer", [
    ({"access_key_id": "SOURCEKEY", "secret_access_key": "sourcesecret"}, "SOURCEKEY"),
    ({"profile_name": "research"}, "PROFKEY"),
])
def test_role_is_assumed_with_the_source_credentials(aws_env, monkeypatch, source, signer):
    aws_env.write_text("[profile research]\naws_access_key_id = PROFKEY\naws_secret_access_key = profsecret\n")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with _STS() as sts:
        storage = ObjectStorage(**S3, endpoint_url=sts.url, role_arn=ROLE, **source)
        assert _resolve(storage) == ("mlsys-assume-role", "ASIAROLE", "rolesecret", "roletoken")
    assert [(r["Action"], r["RoleArn"], r["RoleSessionName"], r["signed_by"]) for r in sts.requests] == [
        ("AssumeRole", ROLE, "mlsys-flows", signer)]


def test_a_role_without_source_credentials_fails_naming_the_role(aws_env):
    with pytest.raises(StorageError, match="role_arn arn:aws:iam::123456789012:role/mlsys: no credentials"):
        _resolve(ObjectStorage(**S3, role_arn=ROLE))


@pytest.mark.parametrize("fields,message", [
    ({"access_key_id": "K"}, "access_key_id and secret_access_key go together"),
    ({"secret_access_key": "S"}, "access_key_id and secret_access_key go together"),
    ({"session_token": "T"}, "session_token needs access_key_id"),
    ({"profile_name": "p", "access_key_id": "K", "secret_access_key": "S"}, "either profile_name or access_key_id"),
    ({"role_arn": "mlsys-role"}, "role_arn must be an IAM role ARN"),
])
def test_inconsistent_credentials_fail_naming_the_fields(fields, message):
    with pytest.raises(ValueError, match=message):
        ObjectStorage(**S3, **fields)
