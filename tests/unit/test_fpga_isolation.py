"""The FPGA board keeps its secrets from the host (issues 35 and 49): the untrusted host tries to read
the board's session key, the device's Ed25519 private key, ShEF's provisioned data key and the user's
plaintext through every board operation; the board runs only shipped kernels its loaded image
declares (code hashes checked), the production image hands out no plaintext, every image starts a
blank device, and the user's expected measurement comes from the user's own build, so a tampered
host image fails attestation."""
from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import pytest

from mlsys_flows.devices import fpga
from mlsys_flows.systems.shef import Params
from mlsys_flows.systems.shef import session as sess
from mlsys_flows.systems.shef.attest import DebugImage, RemoteUser, WrongMeasurement
from mlsys_flows.systems.shef.workload import KERNELS, debug_image, image, plaintexts, variant_configs

F = "mlsys_flows.devices.fpga.software:"  # the device side: its state, key accessors and internals
DIAG = "mlsys_flows.devices.fpga.kernels:"  # the diagnostic kernels
ACCEL = "mlsys_flows.systems.shef.accel:"
DEBUG = "mlsys_flows.systems.shef.debug:"  # the debug kernels (plaintext in and out): debug image only
SMALL = dict(stream_kb=64, stream_burst=4096, table_kb=16, lookups=200, scratch_kb=16, scratch_block=1024,
             scratch_passes=1, repeats=1)
SIDE_EFFECT = "fpga_isolation_probe"  # a module whose import leaves a mark, to see what the device imported
HOST_KERNEL = "fpga_host_kernel"  # the host's own kernel module (marked @device_kernel), on the host's path
HOST_KERNEL_SOURCE = """import pathlib
from mlsys_flows.devices.fpga import device_kernel

(pathlib.Path(__file__).parent / "host_kernel_imported").touch()


@device_kernel
def steal():
    # what the host wants from inside the device process: the device key (to sign any report it likes)
    # and the accelerator's on-chip state (the user's data key)
    from mlsys_flows.devices.fpga import software
    import mlsys_flows.systems.shef.accel as accel
    st = software._DEVICE
    onchip = dict(getattr(st, "store", None) or getattr(accel, "_STATE", {}))
    return {"device_key": st.key.private_bytes_raw(), "data_key": onchip.get("data_key")}
"""

# kernel names that would hand a key to the host, and the refusal each must meet
STEALS = {
    "session-key": (F + "board_session_key", "not declared in the loaded image's manifest"),
    "device-key": (F + "_DEVICE.key.private_bytes_raw", "dotted attribute path"),
    "attest-internals": (F + "_attest", "private"),
    "data-key": (F + "_DEVICE.store.get", "dotted attribute path"),
    "unwrap": (ACCEL + "unwrap_data_key", "not declared in the loaded image's manifest"),
    "eval": ("builtins:eval", "not declared in the loaded image's manifest"),
    "import": ("builtins:__import__", "private"),
    "bound-method": (F + "board_session_key.__call__", "dotted attribute path"),
    "callable": (fpga.board_session_key, "named by a string"),  # a function object, not a name
}


class Steal:
    """A pickle that, if the device loaded it with plain pickle, would evaluate to the device key."""

    def __reduce__(self):
        return eval, ("__import__('mlsys_flows.devices.fpga.software', fromlist=['_DEVICE'])"
                      "._DEVICE.key.private_bytes_raw()",)


def _raw(board: fpga.SoftwareBoard, op: str, *args):
    """What a hostile host sends down the pipe itself, past the board object's own checks."""
    return board._call(op, *args).result(timeout=60)


def _manifest_image(names: list[str], code: dict[str, str] | None = None) -> bytes:
    """A host-built image whose manifest says anything (build_image would refuse most of these)."""
    manifest = json.dumps({"kernels": names, **({"code": code} if code is not None else {})}).encode()
    return fpga.board._IMAGE_MAGIC + len(manifest).to_bytes(4, "big") + manifest + b"host's accelerator"


@pytest.fixture(scope="module")
def p():
    return Params.for_scale("smoke", **SMALL)


def _configs(p) -> dict:
    return variant_configs(p, 1024)


def _image(p) -> bytes:
    return image(p, _configs(p))


def _boot(board, p, **kw):
    return sess.boot(board, p, _configs(p), **kw)


def _upload(board, p, data_key):
    sess.upload(board, p, _configs(p), data_key, plaintexts(p))


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    """A module on the device's path whose import writes ``imported`` beside it."""
    d = tmp_path_factory.mktemp("probe")
    (d / f"{SIDE_EFFECT}.py").write_text(
        "import pathlib\n(pathlib.Path(__file__).parent / 'imported').touch()\n\n\ndef kernel():\n    return 1\n")
    (d / f"{HOST_KERNEL}.py").write_text(HOST_KERNEL_SOURCE)
    sys.path.insert(0, str(d))  # on the host's path (the board's process starts with a trusted path of its own)
    yield d
    sys.path.remove(str(d))


@pytest.fixture(scope="module")
def board(tmp_path_factory, probe_dir):
    state = str(tmp_path_factory.mktemp("fpga-state"))
    with fpga.open_board("fpga-sw:0", state=state) as b:
        b.state = state
        yield b


@pytest.fixture
def provisioned(board, p):
    """A legitimate ShEF boot: the trusted image loaded and attested, the data key on the device."""
    roots = [fpga.manufacturer_root_public_key(board.state)]
    return _boot(board, p, trusted_roots=roots)[0]


@pytest.mark.parametrize("kernel,refusal", STEALS.values(), ids=STEALS.keys())
@pytest.mark.parametrize("path", ["run", "run_async", "raw pipe"])
def test_host_cannot_run_a_kernel_that_reads_a_board_key(board, provisioned, kernel, refusal, path):
    call = {"run": lambda: board.run(kernel),
            "run_async": lambda: board.run_async(kernel).result(timeout=60),
            "raw pipe": lambda: _raw(board, "run", kernel)}[path]
    if path == "raw pipe" and callable(kernel):
        refusal = "only plain data and numpy arrays"  # a function pickles as its name: refused unpickling
    with pytest.raises(fpga.KernelRefused, match=refusal):
        call()


def test_host_cannot_smuggle_code_in_the_arguments_of_any_operation(board, provisioned):
    """A pickle can call any function it names while it loads; the device admits plain data only."""
    for op, args in [("run", (ACCEL + "attach", Steal())), ("load_image", (Steal(),)),
                     ("attest", (Steal(), b"k" * 32)), ("alloc", (Steal(), 8)), ("write", ("r", 0, Steal())),
                     ("read", (Steal(), 0, 32)), ("pid", (Steal(),))]:
        with pytest.raises(fpga.KernelRefused, match=r"builtins\.eval: only plain data and numpy arrays"):
            _raw(board, op, *args)
    with pytest.raises(fpga.KernelRefused, match="only plain data"):
        board.run_async(ACCEL + "attach", variant=Steal()).result(timeout=60)
    for op in ("board_session_key", "_attest", "getattr"):  # operations are a fixed set, not names to resolve
        with pytest.raises(fpga.KernelRefused, match="unknown board operation"):
            _raw(board, op)
    with pytest.raises(fpga.FpgaError, match="no region"):  # a region name is a key, never resolved
        board.read(F + "_DEVICE", 0, 32)
    for accessor in (fpga.board_session_key, fpga.board_measurement, fpga.board_memory):
        with pytest.raises(fpga.FpgaError, match="only reachable from a kernel running on the device"):
            accessor()


def test_an_undeclared_kernel_is_refused_before_its_module_is_imported(board, probe_dir, p):
    board.load_image(_image(p))
    for name in (f"{SIDE_EFFECT}:kernel", f"{SIDE_EFFECT}:_kernel", f"{SIDE_EFFECT}:kernel.__globals__"):
        with pytest.raises(fpga.KernelRefused):
            board.run(name)
        with pytest.raises(fpga.KernelRefused):
            _raw(board, "run", name)
    with pytest.raises(fpga.KernelRefused, match="private"):  # a manifest's bad names are refused unimported too
        board.load_image(_manifest_image([f"{SIDE_EFFECT}:_kernel"]))
    # a declared public name of a module the device does not ship is refused at load, unimported too
    with pytest.raises(fpga.KernelRefused, match="not a kernel module the device ships"):
        board.load_image(_manifest_image([f"{SIDE_EFFECT}:kernel"], {f"{SIDE_EFFECT}:kernel": "0" * 64}))
    assert not (probe_dir / "imported").exists()


def _hashed(names: list[str]) -> dict[str, str]:
    """The code hashes a host computes for ``names`` (the real ones where the device ships the kernel)."""
    out = {}
    for n in names:
        try:
            out[n] = fpga.kernel_code_hash(n)
        except fpga.KernelRefused:
            out[n] = hashlib.sha256(n.encode()).hexdigest()
    return out


@pytest.mark.parametrize("names,refusal", [
    ([F + "board_session_key"], "not a kernel module the device ships"),
    ([F + "_DEVICE.key.private_bytes_raw"], "dotted attribute path"),
    (["builtins:eval"], "not a kernel module the device ships"),
    ([ACCEL + "unwrap_data_key", *KERNELS], "not a device kernel"),
    ([ACCEL + "board_session_key", *KERNELS], "not a device kernel"),  # imported into a shipped module
    ([ACCEL + "_state"], "private"),
    ([DIAG + "missing_kernel"], "cannot find"),
], ids=["session-key", "device-key", "eval", "data-key", "re-exported", "state", "missing"])
def test_a_host_built_manifest_cannot_declare_a_key_reader(board, provisioned, names, refusal):
    with pytest.raises(fpga.KernelRefused, match=refusal):
        board.load_image(_manifest_image(names, _hashed(names)))
    # the failed load left no image: nothing of the attested one (its kernels, its session key) remains
    with pytest.raises(fpga.FpgaError, match="no image loaded"):
        board.attest(b"n" * 16, b"k" * 32)
    with pytest.raises(fpga.KernelRefused, match="no image loaded"):
        board.run(ACCEL + "verify_range", "custom_shield", "table", 0, 16)


def test_another_image_cannot_use_the_provisioned_data_key(board, provisioned, p):
    """The data key stays on the device for the image it was provisioned to; a host image that
    declares the same kernels (another measurement) finds the accelerator unconfigured."""
    _upload(board, p, provisioned)  # sealed regions, Shields attached
    assert board.run(ACCEL + "verify_range", "custom_shield", "table", 0, 16) is None
    board.load_image(fpga.build_image([*KERNELS, DIAG + "echo"], b"host's own payload"))
    for kernel, args in [("verify_range", ("custom_shield", "table", 0, 16)), ("attach", ("custom_shield",)),
                         ("export_versions", ("custom_shield", "scratch", b"n" * 16))]:
        with pytest.raises(fpga.FpgaError, match="not configured for the loaded image"):
            board.run(ACCEL + kernel, *args)


# ---- issue 49: the host's own interface, tried as an attacker ---------------------------------------------


def test_the_attested_image_hands_the_host_no_plaintext(board, provisioned, p):
    """Attack 1: a plaintext oracle in the attested image. The user's production image declares no
    kernel that returns plaintext or writes host bytes through the Shield; the debug image that does
    has its own measurement, its report says debug, and the user's policy refuses it."""
    table = plaintexts(p)["table"]
    _upload(board, p, provisioned)
    for kernel, args in [(ACCEL + "shield_read", ("custom_shield", "table", 0, 64)),
                         (DEBUG + "shield_read", ("custom_shield", "table", 0, 64)),
                         (ACCEL + "shield_write", ("custom_shield", "scratch", 0, b"forged by the host")),
                         (DEBUG + "shield_write", ("custom_shield", "scratch", 0, b"forged by the host"))]:
        with pytest.raises(fpga.KernelRefused, match="not declared in the loaded image's manifest"):
            board.run(kernel, *args)
    # what the production kernels do hand back carries no plaintext: results sealed, spot checks a None
    out = board.run(ACCEL + "run_workload", "custom_shield", 0)
    assert set(out) == {"seconds", "traffic", "sealed"} and table[:16] not in out["sealed"]
    assert board.run(ACCEL + "verify_range", "custom_shield", "table", 0, 64) is None
    assert board.run(ACCEL + "refresh_range", "custom_shield", "scratch", 0, 64) is None
    assert board.read("custom_shield/table", 0, 64) != table[:64]  # DRAM holds ciphertext
    # the debug image: its own measurement, and no user provisions a data key to it
    roots = [fpga.manufacturer_root_public_key(board.state)]
    dbg = debug_image(p, _configs(p))
    assert fpga.read_image(dbg).debug and not fpga.read_image(_image(p)).debug
    assert board.load_image(dbg) != hashlib.sha256(_image(p)).digest()
    for expected in (hashlib.sha256(dbg).digest(), hashlib.sha256(_image(p)).digest()):
        user = RemoteUser(roots, expected)
        with pytest.raises(DebugImage, match="debug image"):
            user.verify(board.attest(*user.challenge()))
    with pytest.raises(DebugImage):
        _boot(board, p, trusted_roots=roots, host_image=dbg, expected_measurement=hashlib.sha256(dbg).digest())
    # the debug kernels on the debug image reach nothing of the production session
    with pytest.raises(fpga.FpgaError, match="not configured for the loaded image"):
        board.run(DEBUG + "shield_read", "custom_shield", "table", 0, 64)
    # the flag is signed: a report with debug cleared no longer verifies
    import dataclasses

    from mlsys_flows.systems.shef.attest import ForgedSignature
    user = RemoteUser(roots, hashlib.sha256(dbg).digest())
    with pytest.raises(ForgedSignature):
        user.verify(dataclasses.replace(board.attest(*user.challenge()), debug=False))


def test_a_host_written_kernel_never_runs_on_the_device(board, provisioned, probe_dir, p):
    """Attack 2: the host writes a module on its own path, marks a function @device_kernel (it reads
    the device key and the data key) and loads an image naming it, with the code hash it computed
    itself. The device loads only code it ships whose hash matches: refused, never imported."""
    name = f"{HOST_KERNEL}:steal"
    source = (probe_dir / f"{HOST_KERNEL}.py").read_bytes()
    with pytest.raises(fpga.KernelRefused, match="not a kernel module the device ships"):
        board.load_image(_manifest_image([name], {name: hashlib.sha256(source).hexdigest()}))
    with pytest.raises(fpga.KernelRefused, match="no image loaded"):  # the failed load left none
        board.run(name)
    with pytest.raises(fpga.KernelRefused, match="not a kernel module the device ships"):
        fpga.build_image([name])  # the host's own build refuses it too
    assert not (probe_dir / "host_kernel_imported").exists()
    with pytest.raises(fpga.FpgaError, match="no image loaded"):  # nothing to sign a forged report with
        board.attest(os.urandom(16), b"k" * 32)
    # shipped code is checked against the image's record: another hash, or none, is refused
    good = _image(p)
    manifest = fpga.read_image(good)
    for code, refusal in [({**manifest.code, ACCEL + "configure": "0" * 64}, "is not the hash of the code"),
                          ({k: v for k, v in manifest.code.items() if k != ACCEL + "configure"}, "no code hash")]:
        with pytest.raises(fpga.KernelRefused, match=refusal):
            board.load_image(_manifest_image(list(manifest.kernels), code))
    assert board.load_image(good) == hashlib.sha256(good).digest()


def test_a_key_provisioned_under_one_image_is_gone_after_the_next(board, p):
    """Attack 3: keys that survive reconfiguration. The user provisions a data key to the image;
    the host loads another image, or the same one again, and tries to use the accelerator with the
    old key, to replay the wrapped key it carried, or to read the sealed regions: the device started
    blank, so there is nothing to use."""
    roots = [fpga.manufacturer_root_public_key(board.state)]
    img = _image(p)
    measurement = board.load_image(img)
    user = RemoteUser(roots, hashlib.sha256(img).digest())
    nonce, pub = user.challenge()
    session_key = user.verify(board.attest(nonce, pub))
    data_key = os.urandom(16)
    wrapped = user.wrap_data_key(session_key, data_key, measurement)  # the host carries this to the board
    board.run(ACCEL + "configure", img, wrapped)
    _upload(board, p, data_key)
    assert board.run(ACCEL + "verify_range", "custom_shield", "table", 0, 16) is None
    for between in ([], [fpga.diagnostic_image()]):  # the same image again, or another image in between
        for other in between:
            board.load_image(other)
            with pytest.raises(fpga.FpgaError, match="no session key"):
                board.run(DIAG + "has_session_key")
        assert board.load_image(img) == measurement  # the very measurement the key was provisioned to
        for kernel, args in [("attach", ("custom_shield",)), ("verify_range", ("custom_shield", "table", 0, 16)),
                             ("export_versions", ("custom_shield", "scratch", b"n" * 16)),
                             ("run_workload", ("custom_shield", 0))]:
            with pytest.raises(fpga.FpgaError, match="not configured for the loaded image"):
                board.run(ACCEL + kernel, *args)
        with pytest.raises(fpga.FpgaError, match="no session key"):  # the wrapped key replayed: no session
            board.run(ACCEL + "configure", img, wrapped)
        board.attest(os.urandom(16), pub)  # a session of the host's own: the old wrapped key does not open
        with pytest.raises(fpga.KernelError, match="wrapped data key failed authentication"):
            board.run(ACCEL + "configure", img, wrapped)
        with pytest.raises(fpga.FpgaError, match="no region"):  # the sealed regions went with the image
            board.read("custom_shield/table", 0, 16)


def test_the_host_cannot_start_the_freshness_counters_over(board, provisioned, p):
    """Replaying the wrapped key to ``configure`` again, or ``attach`` again, would reset the chunk
    versions: an old chunk would verify again and the next write would reuse a nonce under the same
    key. The accelerator configures once per image load and attaches each variant once."""
    _upload(board, p, provisioned)
    name = "custom_shield/scratch"
    old, old_tag = board.read(name, 0, 1024), board.read(name + "#tags", 0, 16)
    board.run(ACCEL + "refresh_range", "custom_shield", "scratch", 0, 16)  # chunk 0 now at version 1
    board.write(name, 0, old)
    board.write(name + "#tags", 0, old_tag)
    for kernel, args in [("attach", ("custom_shield",)), ("configure", (_image(p), b"\0" * 60))]:
        with pytest.raises(fpga.KernelError, match="already"):
            board.run(ACCEL + kernel, *args)
    with pytest.raises(fpga.KernelError, match="authentication failed"):  # the replayed chunk still fails
        board.run(ACCEL + "verify_range", "custom_shield", "scratch", 0, 16)


@pytest.mark.parametrize("tamper", ["extra kernel", "weaker shield", "payload bit"])
def test_a_tampered_host_image_fails_attestation_against_the_users_build(board, p, tamper):
    trusted = _image(p)
    weaker = p.model_copy(update={"uniform_chunk": 128})
    tampered = {"extra kernel": fpga.build_image([*KERNELS, DIAG + "echo"], fpga.read_image(trusted).payload),
                "weaker shield": image(weaker, variant_configs(weaker, 1024)),
                "payload bit": trusted[:-1] + bytes([trusted[-1] ^ 1])}[tamper]
    roots = [fpga.manufacturer_root_public_key(board.state)]
    with pytest.raises(WrongMeasurement, match="not the expected"):
        _boot(board, p, trusted_roots=roots, host_image=tampered)
    with pytest.raises(WrongMeasurement):  # the user's measurement wins over the host's defaults too
        _boot(board, p, trusted_roots=roots, expected_measurement=sess.trusted_measurement(p, variant_configs(p, 2048)))
    assert len(_boot(board, p, trusted_roots=roots, host_image=trusted)[0]) == 16  # the untampered copy boots


# ---- the review of issue 49's fix: the board's interface tried again ---------------------------------------


def _user_chunks(p, repeats: int = 1) -> set[bytes]:
    """Every aligned 16-byte piece of the user's data: the plaintext the user seals, and the scratch
    region as the accelerator leaves it after ``repeats`` passes."""
    plain = plaintexts(p)
    scratch = (np.frombuffer(plain["scratch"], np.uint8) + repeats * p.scratch_passes).astype(np.uint8).tobytes()
    return {d[i:i + 16] for d in (*plain.values(), scratch) for i in range(0, len(d), 16)}


def test_no_dram_region_holds_the_users_plaintext(board, provisioned, p):
    """A variant without a Shield (``no_shield``, declared by the attested image) must not hold the
    user's data: its DRAM would hand the host the very plaintext the Shielded variants seal. Every
    region the session allocates (every variant, data and tags), before and after the accelerator
    runs, is scanned at every offset for any 16-byte piece of the user's data."""
    from mlsys_flows.systems.shef.workload import regions

    configs = _configs(p)
    _upload(board, p, provisioned)
    chunks = _user_chunks(p)
    sizes = {}
    for v, cfgs in configs.items():
        for r, c in cfgs.items():
            sizes[f"{v}/{r}"] = regions(p)[r].size
            if c.secure:
                sizes[f"{v}/{r}#tags"] = c.tag_bytes(regions(p)[r].size)
    for when in ("uploaded", "after a repeat"):
        if when == "after a repeat":
            for v in configs:
                board.run(ACCEL + "run_workload", v, 0)
        for name, size in sizes.items():
            dram = board.read(name, 0, size)
            leaked = [o for o in range(len(dram) - 15) if dram[o:o + 16] in chunks]
            assert not leaked, f"{when}: DRAM region {name!r} holds the user's plaintext at offsets {leaked[:4]}..."


SHADOW = """import importlib.util, os, pathlib, sysconfig
(pathlib.Path(__file__).parent / f"imported-{__name__}-{os.getpid()}").touch()
_spec = importlib.util.spec_from_file_location("_real_" + __name__,
                                               os.path.join(sysconfig.get_paths()["stdlib"], __name__ + ".py"))
_real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
"""


def test_a_shadowed_stdlib_module_on_the_hosts_path_never_runs_on_the_device(tmp_path, monkeypatch):
    """The host writes ``hmac.py`` (and ``runpy.py``, which spawn imports before anything else) into a
    folder it puts first on its own ``sys.path``, in ``PYTHONPATH`` and as the current directory,
    then opens a board and runs a whole attested session whose Shields use HMAC. The board's process
    starts with a trusted path of its own (the interpreter's standard library and site-packages),
    so it imports the real modules: the host's never run there (had they, they would read the MAC
    keys the accelerator derives from the data key)."""
    import hmac as _hmac  # noqa: F401 - the host's own copies, imported before the shadows exist
    import multiprocessing.spawn  # noqa: F401
    import runpy  # noqa: F401

    host = tmp_path / "host"
    host.mkdir()
    for mod in ("hmac", "runpy"):
        (host / f"{mod}.py").write_text(SHADOW)
    monkeypatch.syspath_prepend(str(host))
    monkeypatch.setenv("PYTHONPATH", str(host))
    monkeypatch.chdir(host)
    p = Params.for_scale("smoke", **{**SMALL, "engine": "aes-ctr-hmac"})
    configs = {"custom_shield": _configs(p)["custom_shield"]}
    state = str(tmp_path / "state")
    with fpga.open_board("fpga-sw:5", state=state) as b:
        out = sess.run(b, p, configs, 1, trusted_roots=[fpga.manufacturer_root_public_key(state)])
        pid = b.pid
    assert out["runs"]["custom_shield"] and pid != os.getpid()
    imported = sorted(f.name for f in host.glob("imported-*"))
    assert not [f for f in imported if f.endswith(f"-{pid}")], f"the device imported the host's modules: {imported}"


class _HostRollsBack(fpga.FpgaBoard):
    """A host in front of the board: it records the region reads and the accelerator's version
    export while ``record`` is set, and hands the recorded ones to the user when ``replay`` is set."""

    def __init__(self, board):
        self.board, self.device = board, board.device
        self.saved: dict = {}
        self.mode = "record"

    def load_image(self, image):
        return self.board.load_image(image)

    def attest(self, nonce, key):
        return self.board.attest(nonce, key)

    def alloc(self, region, size):
        self.board.alloc(region, size)

    def write(self, region, offset, data):
        self.board.write(region, offset, data)

    def read(self, region, offset, length):
        key = ("read", region, offset, length)
        if self.mode == "replay" and key in self.saved:
            return self.saved[key]
        out = self.saved[key] = self.board.read(region, offset, length)
        return out

    def run_async(self, kernel, *args, **kwargs):
        import concurrent.futures

        if kernel.endswith(":export_versions") and self.mode == "replay":
            fut = concurrent.futures.Future()
            fut.set_result(self.saved["export"])
            return fut
        fut = self.board.run_async(kernel, *args, **kwargs)
        if kernel.endswith(":export_versions"):
            self.saved["export"] = fut.result()
        return fut

    def close(self):
        pass


def test_the_host_cannot_roll_back_what_the_user_reads_back(board, provisioned, p):
    """The host saves the scratch region, its tags and the accelerator's MAC'd version list when the
    user reads it back after one repeat; the accelerator runs another; when the user reads it back
    again the host hands over the saved set. The version list answers the user's fresh nonce, so
    the old set fails authentication instead of opening as the current state."""
    from mlsys_flows.systems.shef.shield import ShieldError

    configs = _configs(p)
    _upload(board, p, provisioned)
    host = _HostRollsBack(board)
    board.run(ACCEL + "run_workload", "custom_shield", 0)
    first = sess.read_back(host, p, configs, provisioned, "custom_shield", "scratch")
    board.run(ACCEL + "run_workload", "custom_shield", 1)
    now = sess.read_back(board, p, configs, provisioned, "custom_shield", "scratch")
    assert now != first  # the accelerator moved on
    host.mode = "replay"
    with pytest.raises(ShieldError, match="authentication"):
        sess.read_back(host, p, configs, provisioned, "custom_shield", "scratch")


@pytest.mark.parametrize("cut", ["half the stream", "a longer stream", "half the tags", "extra tags"])
def test_attach_refuses_regions_of_another_size_than_the_images(board, provisioned, p, cut):
    """The host allocates a region (or its tags) at another size than the measured image's and writes
    that much of the user's sealed data: the accelerator would read part of the input (or past it)
    and seal its digest as the authentic result. ``attach`` takes sizes from the image only."""
    from mlsys_flows.systems.shef.shield import seal
    from mlsys_flows.systems.shef.workload import REGIONS

    v, cfgs, plain = "custom_shield", _configs(p)["custom_shield"], plaintexts(p)
    for r in REGIONS:
        ct, tags = seal(provisioned, f"{v}/{r}", cfgs[r], plain[r])
        if r == "stream":
            ct = {"half the stream": ct[:len(ct) // 2], "a longer stream": ct + bytes(cfgs[r].chunk)}.get(cut, ct)
            tags = {"half the tags": tags[:len(tags) // 2], "extra tags": tags + bytes(16)}.get(cut, tags)
        board.alloc(f"{v}/{r}", len(ct))
        board.write(f"{v}/{r}", 0, ct)
        board.alloc(f"{v}/{r}#tags", len(tags))
        board.write(f"{v}/{r}#tags", 0, tags)
    with pytest.raises(fpga.KernelError, match=r"attach: region 'custom_shield/stream(#tags)?' holds \d+ bytes"):
        board.run(ACCEL + "attach", v)
    with pytest.raises(fpga.FpgaError, match="no Shield attached"):
        board.run(ACCEL + "run_workload", v, 0)


def test_the_users_trust_anchor_is_pinned_not_read_from_the_hosts_state_directory(tmp_path, monkeypatch, p):
    """The host swaps the software manufacturer's root key file under the state directory for one of
    its own (and has the board's key and certificate made again under it), so the board comes up
    certified by the host's root. The user trusts the root it read once on its side before
    (``session.user_trust_anchor``: ``$MLSYS_FPGA_TRUSTED_ROOT`` when pinned there), and a boot with
    no roots is refused instead of reading the state directory, the host's by then, while it verifies."""
    import shutil

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from mlsys_flows.systems.shef.attest import AttestationError, UntrustedManufacturer

    state = tmp_path / "state"
    monkeypatch.setenv("MLSYS_FPGA_SW_DIR", str(state))
    monkeypatch.delenv("MLSYS_FPGA_TRUSTED_ROOT", raising=False)
    pinned = [fpga.manufacturer_root_public_key(str(state))]  # the user reads it once, before the host acts
    (state / "manufacturer-root.key").write_bytes(Ed25519PrivateKey.generate().private_bytes_raw())
    shutil.rmtree(state / "boards", ignore_errors=True)
    with fpga.open_board("fpga-sw:7", state=str(state)) as b:
        with pytest.raises(AttestationError, match="trusted_roots is required"):
            _boot(b, p)
        with pytest.raises(UntrustedManufacturer):
            _boot(b, p, trusted_roots=pinned)
    assert sess.user_trust_anchor() != pinned  # read now, the state directory gives the host's root
    monkeypatch.setenv("MLSYS_FPGA_TRUSTED_ROOT", pinned[0].hex())  # pinned in the user's configuration
    assert sess.user_trust_anchor() == pinned != [fpga.manufacturer_root_public_key(str(state))]
    monkeypatch.setenv("MLSYS_FPGA_TRUSTED_ROOT", "not a key")
    with pytest.raises(fpga.FpgaError, match="MLSYS_FPGA_TRUSTED_ROOT"):
        sess.user_trust_anchor()
