"""Keys that try to leave an ObjectStorage root, and every method that takes a key (issue 35).
Shared by the local (tests/unit/test_blocks.py) and S3 (tests/integration/test_s3_storage.py) tests."""
from __future__ import annotations

import inspect

import pyarrow as pa
import pytest

from mlsys_flows.blocks import ObjectStorage, StorageError

ESCAPES = ["..", "../outside.bin", "a/../../outside.bin", "/etc/passwd", "a\\..\\..\\outside.bin", "a/\0b"]

KEY_METHODS = {
    "path": lambda s, k: s.path(k),
    "url_of": lambda s, k: s.url_of(k),
    "write_bytes": lambda s, k: s.write_bytes(k, b"x"),
    "read_bytes": lambda s, k: s.read_bytes(k),
    "write_json": lambda s, k: s.write_json(k, {"x": 1}),
    "read_json": lambda s, k: s.read_json(k),
    "write_parquet": lambda s, k: s.write_parquet(k, pa.table({"x": [1]})),
    "read_parquet": lambda s, k: s.read_parquet(k),
    "write_path": lambda s, k: s.write_path(k, b"x"),
    "read_path": lambda s, k: s.read_path(k),
    "open_input": lambda s, k: s.open_input(k),
    "exists": lambda s, k: s.exists(k),
    "size": lambda s, k: s.size(k),
    "delete": lambda s, k: s.delete(k),
    "list": lambda s, k: s.list(k),
}


def key_taking_methods() -> set[str]:
    """ObjectStorage's own public methods with a key-like parameter: a new one must join KEY_METHODS."""
    names = {"key", "path", "prefix", "key_or_prefix"}
    return {name for name, fn in vars(ObjectStorage).items()
            if inspect.isfunction(fn) and not name.startswith("_") and names & set(inspect.signature(fn).parameters)}


def assert_refused_everywhere(storage: ObjectStorage, method: str) -> None:
    """Every escaping key is refused by ``method`` with an error naming the key."""
    assert key_taking_methods() == set(KEY_METHODS)
    for key in ESCAPES:
        with pytest.raises(StorageError, match="invalid storage key") as exc:
            KEY_METHODS[method](storage, key)
        assert repr(key) in str(exc.value), (method, key, str(exc.value))
