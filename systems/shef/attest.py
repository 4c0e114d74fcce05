"""Remote attestation, the remote user's side (pure).

Secure boot on the board (``mlsys_flows/devices/fpga/``): a manufacturer root key certifies the
device key; the security kernel measures (sha256) the loaded accelerator image and signs
{device, measurement, nonce, the user's ephemeral X25519 key, its own ephemeral X25519 key}.

The remote user (:class:`RemoteUser`) trusts only manufacturer root keys and the measurement of the
image it built. It issues a fresh nonce with a fresh ephemeral key per attestation, then checks,
in order: the device certificate chains to a trusted root, the report's signature is the device
key's, the nonce is one it issued and has not used, the report echoes its session key, and the
measurement is the expected one, and that the image is not a debug image (one declaring kernels
that hand plaintext to the host or take it from the host; the device signs that flag into the
report): a debug image gets no data key whatever measurement the user was given. Only then it derives the session key (X25519 + HKDF-SHA256, bound
to nonce and measurement) and wraps the data key under it (AES-GCM), for the Shield to unwrap on
the device (:func:`unwrap_data_key`).
"""
from __future__ import annotations

import os

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mlsys_flows.devices.fpga import AttestationReport, certificate_payload, session_key_from
from mlsys_flows.errors import MlsysError


class AttestationError(MlsysError, RuntimeError):
    """The board's report was rejected; nothing is provisioned."""


class UntrustedManufacturer(AttestationError):
    """The device certificate does not verify under any trusted manufacturer root key."""


class ForgedSignature(AttestationError):
    """The report's signature is not the certified device key's."""


class ReplayedNonce(AttestationError):
    """The report answers a nonce this user did not issue, or already used."""


class WrongMeasurement(AttestationError):
    """The board runs an image other than the one the user expects."""


class DebugImage(AttestationError):
    """The board runs a debug image (its kernels hand plaintext to the host); the user's policy refuses it."""


class RemoteUser:
    """The data owner: verifies a board's report and provisions the data key over the session."""

    def __init__(self, trusted_roots: list[bytes], expected_measurement: bytes, allow_debug: bool = False):
        self.roots = [Ed25519PublicKey.from_public_bytes(r) for r in trusted_roots]
        self.expected = expected_measurement
        self.allow_debug = allow_debug  # only a developer's own test of the debug image sets it
        self._outstanding: dict[bytes, X25519PrivateKey] = {}
        self._used: set[bytes] = set()

    def challenge(self) -> tuple[bytes, bytes]:
        """A fresh (nonce, ephemeral X25519 public key) to send to the board's ``attest``."""
        nonce, eph = os.urandom(16), X25519PrivateKey.generate()
        self._outstanding[nonce] = eph
        return nonce, eph.public_key().public_bytes_raw()

    def verify(self, report: AttestationReport) -> bytes:
        """The session key, when every check passes; raises an :class:`AttestationError` otherwise."""
        cert = certificate_payload(report.device, report.device_public_key)
        for root in self.roots:
            try:
                root.verify(report.device_certificate, cert)
                break
            except InvalidSignature:
                continue
        else:
            raise UntrustedManufacturer(f"{report.device}: the device key is not certified by a trusted "
                                        "manufacturer root key")
        try:
            Ed25519PublicKey.from_public_bytes(report.device_public_key).verify(report.signature, report.payload())
        except InvalidSignature:
            raise ForgedSignature(f"{report.device}: the report's signature does not verify under the certified "
                                  "device key (forged or altered report)") from None
        if report.nonce in self._used:
            raise ReplayedNonce(f"{report.device}: nonce {report.nonce.hex()[:16]}... was already used (replayed report)")
        eph = self._outstanding.pop(report.nonce, None)
        if eph is None:
            raise ReplayedNonce(f"{report.device}: the report answers nonce {report.nonce.hex()[:16]}..., "
                                "which this user never issued")
        self._used.add(report.nonce)
        if report.session_public_key != eph.public_key().public_bytes_raw():
            raise AttestationError(f"{report.device}: the report does not echo this user's session key")
        if report.debug and not self.allow_debug:
            raise DebugImage(f"{report.device}: the board runs a debug image (measurement "
                             f"{report.measurement.hex()[:16]}...), whose kernels hand plaintext to the host; "
                             "no data key is provisioned to it")
        if report.measurement != self.expected:
            raise WrongMeasurement(f"{report.device}: image measurement {report.measurement.hex()[:16]}... is not "
                                   f"the expected {self.expected.hex()[:16]}... (a different accelerator image)")
        shared = eph.exchange(X25519PublicKey.from_public_bytes(report.device_session_public_key))
        return session_key_from(shared, report.nonce, report.measurement)

    @staticmethod
    def wrap_data_key(session_key: bytes, data_key: bytes, measurement: bytes) -> bytes:
        """``nonce || AES-GCM(session_key, data_key)``, bound to the measurement."""
        nonce = os.urandom(12)
        return nonce + AESGCM(session_key).encrypt(nonce, data_key, b"shef-data-key|" + measurement)


def unwrap_data_key(session_key: bytes, wrapped: bytes, measurement: bytes) -> bytes:
    """Device side: the data key from :meth:`RemoteUser.wrap_data_key`."""
    try:
        return AESGCM(session_key).decrypt(wrapped[:12], wrapped[12:], b"shef-data-key|" + measurement)
    except InvalidTag:
        raise AttestationError("the wrapped data key failed authentication (wrong session or tampered)") from None
