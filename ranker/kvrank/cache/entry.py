"""The L2 entry format: ``UserKV`` bytes sealed to the key they are stored under and to the
model that made them.

Layout: ``b"KVRC"`` magic, 4-byte little-endian header length, a 16-byte salt, a 16-byte
tag, the JSON header (padded with spaces so the payload starts 16-byte aligned in a Python
``bytes``), the payload (:meth:`UserKV.to_bytes`). The header names the format, the cache
key, the model's identity (version, architecture fingerprint, and the digest of its
artifact — weights, config and code — taken at load) and the K/V dtype. The tag is an
AES-256-GMAC (GCM with nothing to encrypt; NIST SP 800-38D) of the header length, header and
payload under a key made for this entry alone: HMAC-SHA256 of the deployment's secret over
the random salt, so no GCM key ever sees two messages. A pod of another deployment, or
anyone holding only the Redis password, cannot make an entry that opens; an entry copied
under another user's or sequence's key, or written by other weights under the same version
label, opens nowhere but where it was written. GMAC runs at memory speed where AES-NI and
carry-less multiply exist (every x86-64 and Arm server): ~3x a keyed BLAKE3 or HMAC-SHA256
over a 9 MB entry.

:class:`EntryCodec` seals and opens; :meth:`EntryCodec.open` raises
:class:`~kvrank.errors.CorruptEntryError` naming a :class:`Reason` for anything but a genuine
entry of this key and model, which every caller treats as a miss. The cheap checks run
first; decoding copies nothing on the CPU. No pickle anywhere.
"""

from __future__ import annotations

import enum
import hmac
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from kvrank.cache.keys import CacheKey
from kvrank.errors import CorruptEntryError
from kvrank.model.kv import UserKV, json_object

MAGIC = b"KVRC"
ENTRY_FORMAT = 4
"""4: AES-GMAC tag, bound to the key and the model's digest (3: XXH3-64, 2: CRC-32,
1: BLAKE2b: an entry of an older format is a miss, written anew)."""
SALT_BYTES = 16
TAG_BYTES = 16
PREAMBLE = len(MAGIC) + 4 + SALT_BYTES + TAG_BYTES
PAYLOAD_ALIGN = 16
MAX_HEADER_BYTES = 4096
"""Ours is ~300 bytes; a longer one is not ours, and is not parsed."""
TAG_CONTEXT = b"kvrank cache entry tag 1\x00"
"""Prefixed to the salt when an entry's key is derived from the deployment's secret."""
NONCE = bytes(12)
"""GCM's nonce: fixed, as every key tags one entry only."""


class Reason(enum.StrEnum):
    """Why an entry was not served (the ``reason`` label of the corrupt-entry counter)."""

    FRAMING = "framing"
    """Not an entry: bad magic, truncated, header too long or not a JSON object, wrong size."""
    FORMAT = "format"
    """An entry of another format (an older or newer kvrank)."""
    KEY = "key"
    """Sealed for another key: another user's, sequence's or namespace's entry."""
    MODEL = "model"
    """Made by another model: version, architecture, weights or K/V dtype differ."""
    TAG = "tag"
    """The tag does not verify: damaged, or made without this deployment's secret."""
    PAYLOAD = "payload"
    """The tensors do not decode into a state of this model."""
    CHECK = "check"
    """The loaded model refused the state (its layers' shapes, its length)."""
    SCORES = "scores"
    """The state gave scores that are not finite (from any tier): dropped, made again."""


def corrupt(reason: Reason, text: str) -> CorruptEntryError:
    return CorruptEntryError(text, reason.value)


@dataclass(frozen=True)
class ModelIdentity:
    """What an entry must have been made by to be served here."""

    version: str
    fingerprint: str
    """Of the architecture and its config: what fixes the state's shapes."""
    digest: str = ""
    """Of the artifact (weights, config, the code that builds it), taken at load: retraining
    under the same version label is another model."""
    kv_dtype: str | None = None
    """The K/V dtype this deployment stores (``None``: whatever the model encodes)."""


@dataclass(frozen=True)
class EntryCodec:
    model: ModelIdentity
    secrets: Sequence[bytes] = ()
    """The deployment's secret(s): the first seals, any opens (rotation: put the new one
    first, drop the old one once every pod has the new). None: a tag anyone can make, which
    still binds the key and the model but authenticates nothing."""
    device: str = "cpu"

    def seal(self, key: CacheKey, kv: UserKV) -> bytes:
        payload = kv.to_bytes()
        m = self.model
        header = json.dumps(
            {
                "format": ENTRY_FORMAT,
                "key": key.to_string(),
                "model_version": m.version,
                "fingerprint": m.fingerprint,
                "model_digest": m.digest,
                "kv_dtype": kv.kv_dtype,
                "size": len(payload),
            }
        ).encode()
        header += b" " * (-(PREAMBLE + len(header)) % PAYLOAD_ALIGN)
        length, salt = len(header).to_bytes(4, "little"), os.urandom(SALT_BYTES)
        tag = _gmac(self._secrets[0], salt, length, header, payload)
        return MAGIC + length + salt + tag + header + payload

    def open(self, key: CacheKey, data: bytes, *, tag: bool = True) -> UserKV:
        """The entry's state, if ``data`` is a genuine entry of ``key`` made by this model;
        else ``CorruptEntryError`` with its ``reason``. On the CPU the tensors are views on
        ``data``. ``tag=False``: every check but the tag's, which the caller makes with
        :meth:`check_tag` before anything made from the state is answered or stored."""
        if len(data) < PREAMBLE or data[:4] != MAGIC:
            raise corrupt(Reason.FRAMING, "bad magic or truncated preamble")
        size = int.from_bytes(data[4:8], "little")
        if size > min(len(data) - PREAMBLE, MAX_HEADER_BYTES):
            raise corrupt(
                Reason.FRAMING, f"header length {size} exceeds the entry or {MAX_HEADER_BYTES}"
            )
        view = memoryview(data)
        header_bytes, payload = bytes(view[PREAMBLE : PREAMBLE + size]), view[PREAMBLE + size :]
        try:
            header = json_object(header_bytes)
        except (ValueError, RecursionError) as exc:
            raise corrupt(Reason.FRAMING, f"unreadable header: {exc!r}") from exc
        if header.get("format") != ENTRY_FORMAT:
            raise corrupt(Reason.FORMAT, f"entry format {header.get('format')!r} != {ENTRY_FORMAT}")
        if header.get("key") != key.to_string():
            raise corrupt(Reason.KEY, f"entry sealed for key {str(header.get('key'))[:160]!r}")
        self._check_model(header)
        if header.get("size") != len(payload):
            raise corrupt(Reason.FRAMING, "payload size mismatch")
        if tag:
            self.check_tag(data)
        try:
            kv = UserKV.from_bytes(payload, self.device)
        except Exception as exc:  # bytes that verified may still not be a state of ours
            raise corrupt(Reason.PAYLOAD, describe(exc)) from exc
        m = self.model
        if (kv.model_version, kv.fingerprint, kv.kv_dtype) != (
            m.version,
            m.fingerprint,
            header.get("kv_dtype"),
        ):
            raise corrupt(Reason.PAYLOAD, "payload metadata disagrees with the entry header")
        return kv

    def _check_model(self, header: dict[str, object]) -> None:
        m = self.model
        made_by = (header.get("model_version"), header.get("fingerprint"))
        if made_by != (m.version, m.fingerprint) or header.get("model_digest") != m.digest:
            raise corrupt(
                Reason.MODEL,
                f"entry made by model {str(made_by[0])[:64]!r}/{str(made_by[1])[:64]}"
                f" digest {str(header.get('model_digest'))[:64]}, this is {m.version!r}/"
                f"{m.fingerprint} digest {m.digest}",
            )
        if m.kv_dtype is not None and header.get("kv_dtype") != m.kv_dtype:
            raise corrupt(
                Reason.MODEL,
                f"entry stores {str(header.get('kv_dtype'))[:16]!r} K/V, this deployment"
                f" {m.kv_dtype!r}",
            )

    @property
    def _secrets(self) -> Sequence[bytes]:
        return self.secrets or (b"",)

    def check_tag(self, data: bytes) -> None:
        """``CorruptEntryError`` (``tag``) unless framed entry ``data``'s tag verifies."""
        if not self.verifies(data):
            raise corrupt(
                Reason.TAG, "tag does not verify (damaged, or sealed with another secret)"
            )

    def verifies(self, data: bytes) -> bool:
        """Whether framed entry ``data``'s tag is one of this deployment's secrets' (compared
        in constant time)."""
        carried = data[8 + SALT_BYTES : PREAMBLE]
        return any(hmac.compare_digest(self.tag(data, s), carried) for s in self._secrets)

    def tag(self, data: bytes, secret: bytes | None = None) -> bytes:
        """The tag framed entry ``data`` should carry under ``secret`` (default: the sealing
        one): over the header length, then the header and payload."""
        view = memoryview(data)
        salt = bytes(view[8 : 8 + SALT_BYTES])
        key = self._secrets[0] if secret is None else secret
        return _gmac(key, salt, view[4:8], view[PREAMBLE:])


def _entry_key(secret: bytes, salt: bytes) -> bytes:
    """This entry's own AES key (never used for another)."""
    return hmac.digest(secret, TAG_CONTEXT + salt, "sha256")


def _gmac(secret: bytes, salt: bytes, *parts: bytes | memoryview) -> bytes:
    """AES-256-GMAC over ``parts``, as one message, under this entry's key."""
    mac = Cipher(algorithms.AES(_entry_key(secret, salt)), modes.GCM(NONCE)).encryptor()
    for part in parts:
        mac.authenticate_additional_data(part)
    mac.finalize()
    return mac.tag


def describe(exc: Exception) -> str:
    """One line for a log: the error, with its type unless it is a corrupt entry's."""
    text = str(exc) if isinstance(exc, CorruptEntryError) else f"{type(exc).__name__}: {exc}"
    return text[:200]
