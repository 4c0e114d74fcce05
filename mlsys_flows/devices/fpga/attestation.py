"""Attestation: what the manufacturer root key and a device key sign (:func:`certificate_payload`,
:func:`report_payload`), the signed :class:`AttestationReport`, the session key both ends derive
(:func:`session_key_from`), and the software "factory" that keeps the manufacturer root key and makes
each software board's device key and certificate (only the board's process loads a device key)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .state import _device_dir, _file_lock, _write_private, state_dir


# ---------------------------------------------------------------------------------------------
# attestation report


def _encode(tag: bytes, *fields: bytes) -> bytes:
    """Canonical, unambiguous encoding: a domain tag, then each field length-prefixed."""
    return tag + b"".join(len(f).to_bytes(4, "big") + f for f in fields)


def certificate_payload(device: str, device_public_key: bytes) -> bytes:
    """What the manufacturer root key signs: the device's name and its public key."""
    return _encode(b"mlsys-fpga-device-cert-v1", device.encode(), device_public_key)


def report_payload(device: str, measurement: bytes, nonce: bytes, session_public_key: bytes,
                   device_session_public_key: bytes, debug: bool = False) -> bytes:
    """What the device key signs in an attestation report (``debug``: the loaded image declares a
    debug kernel, one that hands plaintext to the host or takes it from the host)."""
    return _encode(b"mlsys-fpga-attestation-v2", device.encode(), measurement, nonce, session_public_key,
                   device_session_public_key, b"\x01" if debug else b"\x00")


@dataclass(frozen=True)
class AttestationReport:
    """A board's signed statement of what it runs, for one verifier's nonce and session key."""

    device: str
    measurement: bytes  # sha256 of the loaded image
    nonce: bytes  # the verifier's nonce, echoed
    session_public_key: bytes  # the verifier's ephemeral X25519 public key, echoed
    device_session_public_key: bytes  # the board's ephemeral X25519 public key (raw, 32 bytes)
    device_public_key: bytes  # the board's Ed25519 public key (raw)
    device_certificate: bytes  # manufacturer root's Ed25519 signature over certificate_payload()
    signature: bytes  # device key's Ed25519 signature over payload()
    debug: bool = False  # the loaded image is a debug image (signed: part of payload())

    def payload(self) -> bytes:
        return report_payload(self.device, self.measurement, self.nonce, self.session_public_key,
                              self.device_session_public_key, self.debug)


def session_key_from(shared_secret: bytes, nonce: bytes, measurement: bytes) -> bytes:
    """HKDF-SHA256 of the X25519 shared secret, salted with the nonce, bound to the measurement."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=nonce,
                info=b"mlsys-fpga-session-v1" + measurement).derive(shared_secret)


# ---------------------------------------------------------------------------------------------
# the software factory: manufacturer root key, device keys and certificates


def _root_key(root: str | None = None):
    """The software manufacturer's Ed25519 root key (created once per state directory)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = state_dir(root)
    path = os.path.join(d, "manufacturer-root.key")
    with _file_lock(os.path.join(d, "factory.lock")):
        if not os.path.exists(path):
            _write_private(path, Ed25519PrivateKey.generate().private_bytes_raw())
        with open(path, "rb") as f:
            return Ed25519PrivateKey.from_private_bytes(f.read())


def manufacturer_root_public_key(root: str | None = None) -> bytes:
    """The raw Ed25519 public key a remote verifier trusts for software boards."""
    return _root_key(root).public_key().public_bytes_raw()


TRUSTED_ROOT_ENV = "MLSYS_FPGA_TRUSTED_ROOT"


def trusted_root_public_key(root: str | None = None) -> bytes:
    """The user's trust anchor: the manufacturer root public key the user pinned in its own
    configuration, ``$MLSYS_FPGA_TRUSTED_ROOT`` (64 hex characters), when set; otherwise the software
    manufacturer's (:func:`manufacturer_root_public_key`), read now. Read it once, on the user's side,
    before any board is used, and pass the value on (``trusted_roots``): a verifier that reads the
    state directory when it verifies trusts whatever root file the host put there by then."""
    from .errors import FpgaError

    pinned = os.environ.get(TRUSTED_ROOT_ENV, "").strip()
    if not pinned:
        return manufacturer_root_public_key(root)
    try:
        key = bytes.fromhex(pinned)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise FpgaError(f"${TRUSTED_ROOT_ENV}: expected a raw Ed25519 public key as 64 hex characters, got "
                        f"{len(pinned)} characters")
    return key


def _manufacture(device: str, root: str | None = None):
    """The device's Ed25519 key and the root's certificate over it (made once, at the "factory")."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = _device_dir(device, root)
    key_path, cert_path = os.path.join(d, "device.key"), os.path.join(d, "device.cert")
    with _file_lock(os.path.join(d, "factory.lock")):
        if not (os.path.exists(key_path) and os.path.exists(cert_path)):
            key = Ed25519PrivateKey.generate()
            pub = key.public_key().public_bytes_raw()
            cert = _root_key(root).sign(certificate_payload(device, pub))
            _write_private(key_path, key.private_bytes_raw())
            _write_private(cert_path, cert)
        with open(key_path, "rb") as f:
            key = Ed25519PrivateKey.from_private_bytes(f.read())
        with open(cert_path, "rb") as f:
            cert = f.read()
    return key, cert
