"""The FPGA board keeps its secrets from the host (issue 35): the untrusted host tries to read the
board's session key, the device's Ed25519 private key and ShEF's provisioned data key through every
board operation; the board runs only the kernels its loaded image declares, and the user's expected
measurement comes from the user's own build, so a tampered host image fails attestation."""
from __future__ import annotations

import json
import sys

import pytest

from mlsys_flows.devices import fpga
from mlsys_flows.systems.shef import Params
from mlsys_flows.systems.shef import session as sess
from mlsys_flows.systems.shef.attest import WrongMeasurement
from mlsys_flows.systems.shef.workload import KERNELS, image, plaintexts

F = "mlsys_flows.devices.fpga.software:"  # the device side: its state, key accessors and internals
DIAG = "mlsys_flows.devices.fpga.kernels:"  # the diagnostic kernels
ACCEL = "mlsys_flows.systems.shef.accel:"
SMALL = dict(stream_kb=64, stream_burst=4096, table_kb=16, lookups=200, scratch_kb=16, scratch_block=1024,
             scratch_passes=1, repeats=1)
SIDE_EFFECT = "fpga_isolation_probe"  # a module whose import leaves a mark, to see what the device imported

# kernel names that would hand a key to the host, and the refusal each must meet
STEALS = {
    "session-key": (F + "board_session_key", "not declared in the loaded image's manifest"),
    "device-key": (F + "_DEVICE.key.private_bytes_raw", "dotted attribute path"),
    "attest-internals": (F + "_attest", "private"),
    "data-key": (ACCEL + "_STATE.get", "dotted attribute path"),
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


def _manifest_image(names: list[str]) -> bytes:
    """A host-built image whose manifest says anything (build_image would refuse most of these)."""
    manifest = json.dumps({"kernels": names}).encode()
    return fpga.board._IMAGE_MAGIC + len(manifest).to_bytes(4, "big") + manifest + b"host's accelerator"


@pytest.fixture(scope="module")
def p():
    return Params.for_scale("smoke", **SMALL)


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    """A module on the device's path whose import writes ``imported`` beside it."""
    d = tmp_path_factory.mktemp("probe")
    (d / f"{SIDE_EFFECT}.py").write_text(
        "import pathlib\n(pathlib.Path(__file__).parent / 'imported').touch()\n\n\ndef kernel():\n    return 1\n")
    sys.path.insert(0, str(d))  # a spawned board starts with the host's sys.path
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
    return sess.boot(board, p, roots)[0]


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
    board.load_image(image(p))
    for name in (f"{SIDE_EFFECT}:kernel", f"{SIDE_EFFECT}:_kernel", f"{SIDE_EFFECT}:kernel.__globals__"):
        with pytest.raises(fpga.KernelRefused):
            board.run(name)
        with pytest.raises(fpga.KernelRefused):
            _raw(board, "run", name)
    with pytest.raises(fpga.KernelRefused, match="private"):  # a manifest's bad names are refused unimported too
        board.load_image(_manifest_image([f"{SIDE_EFFECT}:_kernel"]))
    assert not (probe_dir / "imported").exists()
    # a declared public name is imported at load, and refused there unless it is a marked device kernel
    with pytest.raises(fpga.KernelRefused, match="not a device kernel"):
        board.load_image(_manifest_image([f"{SIDE_EFFECT}:kernel"]))
    assert (probe_dir / "imported").exists()


@pytest.mark.parametrize("names,refusal", [
    ([F + "board_session_key"], "not a device kernel"),
    ([F + "_DEVICE.key.private_bytes_raw"], "dotted attribute path"),
    (["builtins:eval"], "not a device kernel"),
    ([ACCEL + "unwrap_data_key", *KERNELS], "not a device kernel"),
    ([ACCEL + "_STATE"], "private"),
    ([F + "missing_kernel"], "cannot find"),
], ids=["session-key", "device-key", "eval", "data-key", "state", "missing"])
def test_a_host_built_manifest_cannot_declare_a_key_reader(board, provisioned, names, refusal):
    with pytest.raises(fpga.KernelRefused, match=refusal):
        board.load_image(_manifest_image(names))
    # the failed load left no image: nothing of the attested one (its kernels, its session key) remains
    with pytest.raises(fpga.FpgaError, match="no image loaded"):
        board.attest(b"n" * 16, b"k" * 32)
    with pytest.raises(fpga.KernelRefused, match="no image loaded"):
        board.run(ACCEL + "shield_read", "custom_shield", "table", 0, 16)


def test_another_image_cannot_use_the_provisioned_data_key(board, provisioned, p):
    """The data key stays on the device for the image it was provisioned to; a host image that
    declares the same kernels (another measurement) finds the accelerator unconfigured."""
    sess.upload(board, p, provisioned, plaintexts(p))  # sealed regions, Shields attached
    assert board.run(ACCEL + "shield_read", "custom_shield", "table", 0, 16) == plaintexts(p)["table"][:16]
    board.load_image(fpga.build_image([*KERNELS, DIAG + "echo"], b"host's own payload"))
    for kernel, args in [("shield_read", ("custom_shield", "table", 0, 16)), ("attach", ("custom_shield",)),
                         ("export_versions", ("custom_shield", "scratch"))]:
        with pytest.raises(fpga.FpgaError, match="not configured for the loaded image"):
            board.run(ACCEL + kernel, *args)


@pytest.mark.parametrize("tamper", ["extra kernel", "weaker shield", "payload bit"])
def test_a_tampered_host_image_fails_attestation_against_the_users_build(board, p, tamper):
    trusted = image(p)
    tampered = {"extra kernel": fpga.build_image([*KERNELS, DIAG + "echo"], fpga.read_image(trusted).payload),
                "weaker shield": image(p.model_copy(update={"uniform_chunk": 128})),
                "payload bit": trusted[:-1] + bytes([trusted[-1] ^ 1])}[tamper]
    roots = [fpga.manufacturer_root_public_key(board.state)]
    with pytest.raises(WrongMeasurement, match="not the expected"):
        sess.boot(board, p, roots, host_image=tampered)
    with pytest.raises(WrongMeasurement):  # the user's measurement wins over the host's defaults too
        sess.boot(board, p, roots, expected_measurement=sess.trusted_measurement(
            p.model_copy(update={"coarse_chunk": 2 * p.coarse_chunk})))
    assert len(sess.boot(board, p, roots, host_image=trusted)[0]) == 16  # the untampered copy boots
