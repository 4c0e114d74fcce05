"""ObjectStorage: bytes, JSON and parquet on a local folder or any S3 endpoint, written atomically."""
from __future__ import annotations

import io
import json
import os
import uuid
from typing import Any
from urllib.parse import urlparse

from prefect.filesystems import WritableFileSystem
from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from mlsys_flows.errors import MlsysError
from mlsys_flows.settings import default_storage_url

from ._docs import DOCS_URL


class StorageError(MlsysError, RuntimeError):
    """A storage operation failed; the message names the URL and the cause, never a secret."""


class AssumeRoleProvider:
    """A link of boto's credential chain (put first in a session's ``credential_provider``): the
    credentials ``source`` (a session) resolves assume ``role_arn`` through STS, and are assumed
    again shortly before they expire (botocore's refreshable credentials)."""

    METHOD = "mlsys-assume-role"
    SESSION_NAME = "mlsys-flows"  # shows in CloudTrail as the role session

    def __init__(self, source: Any, role_arn: str, endpoint_url: str | None = None, region: str | None = None):
        self.source, self.role_arn, self.endpoint_url, self.region = source, role_arn, endpoint_url, region

    def _sts(self, service: str, **kwargs):
        return self.source.create_client(service, endpoint_url=self.endpoint_url, region_name=self.region, **kwargs)

    async def load(self):
        from aiobotocore.credentials import AioAssumeRoleCredentialFetcher, AioDeferredRefreshableCredentials

        credentials = await self.source.get_credentials()
        if credentials is None:
            raise StorageError(f"role_arn {self.role_arn}: no credentials to assume it with (give keys or "
                               f"profile_name, or configure the default AWS chain)")
        fetcher = AioAssumeRoleCredentialFetcher(self._sts, credentials, self.role_arn,
                                                 extra_args={"RoleSessionName": self.SESSION_NAME})
        return AioDeferredRefreshableCredentials(refresh_using=fetcher.fetch_credentials, method=self.METHOD)


class ObjectStorage(WritableFileSystem):
    """Object storage for datasets, reports and checkpoints: a local folder (``file://``) or an
    S3 bucket and prefix (``s3://bucket/prefix``, any endpoint through s3fs).

    Writes are atomic: one PUT on S3; a temporary file renamed onto the final name in a local
    folder. A crash never leaves a half-written object under the final key.

    S3 credentials come from boto's session chain, as the AWS CLI and prefect-aws find them: the
    static keys given here (with ``session_token`` for temporary ones), else the ``profile_name``
    profile of ``~/.aws/config``, else the default chain (``AWS_*`` variables, the default profile,
    SSO, container and instance roles). With ``role_arn``, those credentials assume the role through
    STS (``endpoint_url``'s STS when set) and are refreshed before they expire.

    Example:
        Save one (once), then load it by name in flows, the CLI (``--storage``) or the UI:
        ```python
        from mlsys_flows.blocks import ObjectStorage

        ObjectStorage(url="s3://mlsys/runs", endpoint_url="http://127.0.0.1:8333",
                      access_key_id="...", secret_access_key="...").save("BLOCK_NAME")
        storage = ObjectStorage.load("BLOCK_NAME")
        storage.write_json("hello.json", {"ok": True})
        ```

        On AWS with a profile, or the default chain, and a role to assume:
        ```python
        from mlsys_flows.blocks import ObjectStorage

        ObjectStorage(url="s3://my-bucket/mlsys", region="eu-west-1", profile_name="research",
                      role_arn="arn:aws:iam::123456789012:role/mlsys-runs").save("BLOCK_NAME")
        storage = ObjectStorage.load("BLOCK_NAME")
        ```
    """

    _block_type_name = "mlsys ObjectStorage"
    _block_type_slug = "mlsys-object-storage"
    _documentation_url = DOCS_URL + "#objectstorage"
    _description = "A file:// folder or an s3:// bucket/prefix with atomic writes of bytes, JSON and parquet."

    url: str = Field(default="", description="fsspec URL of the root: file:///path or s3://bucket/prefix. "
                                             "Empty means the project's data folder (.mlsys-flows/storage).")
    endpoint_url: str | None = Field(default=None, description="S3 endpoint, e.g. http://127.0.0.1:8333 for SeaweedFS or MinIO; "
                                                               "empty for AWS.")
    region: str | None = Field(default=None, description="S3 region name, e.g. us-east-1.")
    access_key_id: SecretStr | None = Field(default=None, description="S3 access key id (kept secret, never logged); "
                                                                     "empty: the profile or the default chain.")
    secret_access_key: SecretStr | None = Field(default=None, description="S3 secret access key (kept secret, never logged).")
    session_token: SecretStr | None = Field(default=None, description="Session token of temporary credentials, with "
                                                                     "access_key_id and secret_access_key (kept secret, "
                                                                     "never logged).")
    profile_name: str | None = Field(default=None, description="AWS profile (~/.aws/config, ~/.aws/credentials) to take "
                                                               "credentials from when no keys are given; empty: the "
                                                               "default chain (AWS_* variables, default profile, "
                                                               "instance or container role).")
    role_arn: str | None = Field(default=None, description="IAM role to assume through STS with the credentials above, "
                                                           "e.g. arn:aws:iam::123456789012:role/mlsys; refreshed before "
                                                           "it expires. Empty: use the credentials as they are.")
    max_attempts: int = Field(default=3, ge=1, le=20, description="Attempts per S3 request before a write or read fails.")
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="Connect and read timeout of one S3 request, seconds.")
    # One S3 client per storage object: building one costs ~0.3-1 s. Not pickled (see __getstate__).
    _fs_cache: Any = PrivateAttr(default=None)

    def __getstate__(self):
        state = super().__getstate__()
        private = dict(state.get("__pydantic_private__") or {})
        private["_fs_cache"] = None  # a live client (event loop, sockets) must not travel to Dask workers
        return {**state, "__pydantic_private__": private}

    @model_validator(mode="after")
    def _check_credentials(self) -> "ObjectStorage":
        if bool(self.access_key_id) != bool(self.secret_access_key):
            raise ValueError("access_key_id and secret_access_key go together: give both or neither")
        if self.session_token and not self.access_key_id:
            raise ValueError("session_token needs access_key_id and secret_access_key (temporary credentials)")
        if self.profile_name and self.access_key_id:
            raise ValueError("give either profile_name or access_key_id/secret_access_key, not both")
        if self.role_arn and not self.role_arn.startswith("arn:"):
            raise ValueError(f"role_arn must be an IAM role ARN, arn:aws:iam::ACCOUNT:role/NAME (got {self.role_arn!r})")
        return self

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if not v:
            return v
        scheme = urlparse(v).scheme
        if scheme not in ("file", "s3"):
            raise ValueError(f"url must start with file:// or s3:// (got scheme {scheme or 'none'!r})")
        if scheme == "s3" and not urlparse(v).netloc:
            raise ValueError("url s3:// needs a bucket name: s3://bucket/prefix")
        return v.rstrip("/")

    # ----- filesystem -----------------------------------------------------------------
    @property
    def root_url(self) -> str:
        return self.url or default_storage_url()

    @property
    def is_s3(self) -> bool:
        return self.root_url.startswith("s3://")

    def filesystem(self):
        """(fsspec filesystem, root path without scheme)."""
        if self._fs_cache is None:
            self._fs_cache = self._make_filesystem()
        return self._fs_cache

    def _make_filesystem(self):
        parsed = urlparse(self.root_url)
        if parsed.scheme == "s3":
            import s3fs

            client_kwargs = {k: v for k, v in {"endpoint_url": self.endpoint_url, "region_name": self.region}.items() if v}
            fs = s3fs.S3FileSystem(
                session=self.aws_session(), anon=False, client_kwargs=client_kwargs, skip_instance_cache=True,
                use_listings_cache=False,
                config_kwargs={"retries": {"max_attempts": self.max_attempts, "mode": "standard"},
                               "connect_timeout": self.timeout_s, "read_timeout": self.timeout_s},
            )
            return fs, f"{parsed.netloc}{parsed.path}".rstrip("/")
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(), parsed.path.rstrip("/") or "/"

    def aws_session(self):
        """The botocore session (aiobotocore's, which s3fs drives) whose credential chain is the one
        the fields configure (see the class docstring). Nothing is fetched until the first request."""
        from aiobotocore.session import AioSession

        source = AioSession(profile=self.profile_name)
        if self.access_key_id:
            source.set_credentials(self.access_key_id.get_secret_value(), self.secret_access_key.get_secret_value(),
                                   self.session_token.get_secret_value() if self.session_token else None)
        if not self.role_arn:
            return source
        session = AioSession()
        session.get_component("credential_provider").insert_before(
            "env", AssumeRoleProvider(source, self.role_arn, self.endpoint_url, self.region))
        return session

    def _key(self, key: str, prefix: bool = False) -> str:
        """``key`` checked to stay under the root (every key-taking method calls this first):
        no absolute path, no ``..`` component, no backslash (a separator on Windows), no NUL.
        Only a ``prefix`` (of ``list``) may be empty, meaning the whole root."""
        if not isinstance(key, str):
            raise StorageError(f"invalid storage key {key!r}: must be a string")
        if key.startswith("/"):
            why = "absolute path"
        elif "\\" in key or "\0" in key:
            why = "backslash or NUL character"
        elif ".." in key.split("/"):
            why = "'..' component"
        elif not key.strip("/") and not prefix:
            why = "empty"
        else:
            return key.strip("/")
        raise StorageError(f"invalid storage key {key!r} ({why}): keys are relative paths under {self.root_url}")

    def url_of(self, key: str) -> str:
        """Where ``key`` lies, as a URL a user can open or pass to another tool."""
        return f"{self.root_url}/{self._key(key)}"

    def path(self, key: str) -> str:
        return f"{self.filesystem()[1]}/{self._key(key)}"

    def _fail(self, action: str, key: str, exc: BaseException) -> StorageError:
        cause = type(exc).__name__
        text = str(exc)
        for secret in (self.access_key_id, self.secret_access_key, self.session_token):
            if secret is not None and secret.get_secret_value():
                text = text.replace(secret.get_secret_value(), "**********")
        if "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text or "AccessDenied" in text or isinstance(exc, PermissionError):
            hint = f"the S3 server rejected the credentials (check {self._credential_fields()})" if self.is_s3 else "permission denied"
        else:
            hint = f"{cause}: {text[:300]}"
        return StorageError(f"{action} {key!r} on {self.root_url} failed: {hint}")

    def _credential_fields(self) -> str:
        """The fields the credentials came from, for an error message (never their values)."""
        given = [name for name in ("access_key_id", "secret_access_key", "session_token", "profile_name", "role_arn")
                 if getattr(self, name)]
        return ", ".join(given) if given else "the default AWS credential chain: AWS_* variables, ~/.aws"

    def check(self) -> "ObjectStorage":
        """Fail fast, before any work, if the root cannot be reached or written."""
        fs, root = self.filesystem()
        try:
            if self.is_s3:
                bucket = root.split("/", 1)[0]
                try:
                    fs.ls(bucket)
                except FileNotFoundError:
                    raise StorageError(f"storage url {self.root_url}: bucket {bucket!r} does not exist") from None
            else:
                parent = os.path.dirname(root)
                if not os.path.isdir(root) and not os.path.isdir(parent) and self.url:
                    raise StorageError(f"storage url {self.root_url}: folder {parent} does not exist")
                fs.makedirs(root, exist_ok=True)
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - turned into one clear message
            raise self._fail("checking", "", exc) from None
        return self

    # ----- bytes ----------------------------------------------------------------------
    def write_bytes(self, key: str, data: bytes) -> str:
        """Write atomically: readers see the whole object or none. On S3 one PUT (or one multipart
        upload, which completes at once) already is; a local folder needs a temporary file, then a
        rename onto the final name."""
        fs, _ = self.filesystem()
        final = self.path(key)
        if self.is_s3:
            try:
                fs.pipe_file(final, data)
            except Exception as exc:  # noqa: BLE001
                raise self._fail("writing", key, exc) from None
            return final
        parent, name = final.rsplit("/", 1)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{name}"
        try:
            fs.makedirs(parent, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except Exception as exc:  # noqa: BLE001
            try:
                if fs.exists(tmp):
                    fs.rm_file(tmp)
            except Exception:  # noqa: BLE001 - the server may be down; the temp key is never read
                pass
            raise self._fail("writing", key, exc) from None
        return final

    # ----- Prefect's WritableFileSystem: usable as a flow's result storage -------------------
    # (Prefect's sync code paths pass ``_sync=True``, as to its own sync_compatible blocks)
    def read_path(self, path: str, **_: Any) -> bytes:
        """Bytes at ``path`` (a key under the root), for Prefect's result store."""
        return self.read_bytes(path)

    def write_path(self, path: str, content: bytes, **_: Any) -> str:
        """Write ``content`` at ``path`` (a key under the root) atomically, for Prefect's result store."""
        return self.write_bytes(path, content)

    def _resolve_path(self, path: str) -> None:
        """Keys stay relative to the root: Prefect's result store asks an unsaved block for absolute
        paths (as ``LocalFileSystem`` gives); None tells it to use the key as it is."""
        return None

    def read_bytes(self, key: str) -> bytes:
        fs, path = self.filesystem()[0], self.path(key)
        try:
            return fs.cat_file(path)
        except FileNotFoundError:
            raise StorageError(f"no object {key!r} under {self.root_url}") from None
        except Exception as exc:  # noqa: BLE001
            raise self._fail("reading", key, exc) from None

    def open_input(self, key: str):
        """A seekable binary file, read lazily (only the byte ranges asked for are fetched)."""
        fs, path = self.filesystem()[0], self.path(key)
        try:
            return fs.open(path, "rb")
        except FileNotFoundError:
            raise StorageError(f"no object {key!r} under {self.root_url}") from None

    def exists(self, key: str) -> bool:
        fs, _ = self.filesystem()
        return fs.exists(self.path(key))

    def size(self, key: str) -> int:
        fs, _ = self.filesystem()
        return int(fs.size(self.path(key)))

    def list(self, prefix: str = "") -> list[str]:
        """Keys (relative to the root) of the objects under ``prefix``, temporaries excluded."""
        fs, root = self.filesystem()
        base = f"{root}/{self._key(prefix, prefix=True)}".rstrip("/")
        try:
            found = fs.find(base)
        except FileNotFoundError:
            return []
        keys = [p[len(root) + 1:] for p in found]
        return sorted(k for k in keys if not k.rsplit("/", 1)[-1].startswith(".tmp-"))

    def delete(self, key_or_prefix: str) -> None:
        fs, _ = self.filesystem()
        p = self.path(key_or_prefix)
        if fs.exists(p):
            fs.rm(p, recursive=True)

    # ----- JSON and parquet -----------------------------------------------------------
    def write_json(self, key: str, obj: Any) -> str:
        return self.write_bytes(key, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def read_json(self, key: str) -> Any:
        return json.loads(self.read_bytes(key))

    def write_parquet(self, key: str, table, compression: str = "zstd", row_group_size: int | None = None) -> int:
        """Write a pyarrow Table as parquet; returns the bytes written."""
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table, buf, compression=compression, row_group_size=row_group_size)
        data = buf.getvalue()
        self.write_bytes(key, data)
        return len(data)

    def read_parquet(self, key: str, columns: list[str] | None = None):
        import pyarrow.parquet as pq

        with self.open_input(key) as fh:
            return pq.read_table(fh, columns=columns)
