"""Key agreement, mask expansion and share encryption for secure aggregation.

All primitives come from ``cryptography`` (maintained, constant-time); this module only
fixes how they are combined, following Bonawitz et al. (CCS 2017):

* **Keys**: X25519 key pairs; a public key travels as 32 raw bytes.
* **Pairwise seed**: ``s_uv = HKDF-SHA256(DH(sk_u, pk_v), info = b"commgnn-secagg-pair" ||
  round_id)`` (32 bytes). DH is symmetric, so ``s_uv = s_vu`` and both ends expand the
  same mask.
* **PRG**: a 32-byte seed keys AES-256-CTR (zero nonce: every seed is used for one stream
  only); the keystream read as little-endian words, reduced modulo ``2^m``, gives ``n``
  uniform ring elements ``int64 [n]`` (4-byte words when ``m <= 32``, else 8-byte). One
  call into OpenSSL, no Python loop per element.
* **Share encryption**: AES-256-GCM under ``HKDF-SHA256(DH(c_u, c_v), info =
  b"commgnn-secagg-share" || round_id)``, a fresh 12-byte nonce prepended to each
  ciphertext, associated data ``sender || receiver || round_id`` so a ciphertext cannot
  be replayed to another pair or round. Overhead: :data:`AEAD_OVERHEAD` = 28 bytes.

Randomness (private keys, nonces) comes from an ``entropy(n) -> bytes`` callable,
``os.urandom`` unless a test passes a seeded one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from torch import Tensor

from commgnn.federated.secagg.ring import modulus_mask

Entropy = Callable[[int], bytes]

PUBLIC_KEY_BYTES = 32
"""A raw X25519 public key."""

PRIVATE_KEY_BYTES = 32
"""A raw X25519 private key."""

SEED_BYTES = 32
"""A PRG seed (the AES-256 key)."""

NONCE_BYTES = 12
AEAD_OVERHEAD = NONCE_BYTES + 16
"""Bytes an encrypted message adds to its plaintext: the nonce and the GCM tag."""

PAIR_INFO = b"commgnn-secagg-pair"
SHARE_INFO = b"commgnn-secagg-share"


def round_bytes(round_id: int) -> bytes:
    """The round id as 8 big-endian bytes (bound into every derived key)."""
    return int(round_id).to_bytes(8, "big", signed=False)


@dataclass(frozen=True)
class KeyPair:
    """An X25519 key pair; ``public`` is the 32 raw bytes that travel."""

    private: X25519PrivateKey
    public: bytes

    @classmethod
    def generate(cls, entropy: Entropy = os.urandom) -> KeyPair:
        """A fresh key pair (X25519 clamps any 32 random bytes into a valid key)."""
        return cls.from_private_bytes(entropy(PRIVATE_KEY_BYTES))

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> KeyPair:
        sk = X25519PrivateKey.from_private_bytes(raw)
        return cls(private=sk, public=sk.public_key().public_bytes_raw())

    def private_bytes(self) -> bytes:
        """The 32 raw private bytes (what secure aggregation Shamir-shares)."""
        return self.private.private_bytes_raw()


def agree(private: X25519PrivateKey, peer_public: bytes, info: bytes, length: int = 32) -> bytes:
    """``HKDF-SHA256(DH(private, peer_public), info)``: ``length`` bytes."""
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(shared)


def pair_seed(private: X25519PrivateKey, peer_public: bytes, round_id: int) -> bytes:
    """The pairwise mask seed ``s_uv`` (equal at both ends)."""
    return agree(private, peer_public, PAIR_INFO + round_bytes(round_id))


def share_key(private: X25519PrivateKey, peer_public: bytes, round_id: int) -> bytes:
    """The AES-256-GCM key two clients use for share messages this round."""
    return agree(private, peer_public, SHARE_INFO + round_bytes(round_id))


def prg(seed: bytes, n: int, m: int) -> Tensor:
    """``n`` uniform ring elements mod ``2^m`` (int64 ``[n]``) expanded from a 32-byte seed."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a PRG seed is {SEED_BYTES} bytes, got {len(seed)}")
    word = 4 if m <= 32 else 8
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    stream = enc.update(bytes(word * n)) + enc.finalize()  # AES-CTR of zeros = keystream
    words = np.frombuffer(stream, dtype="<u4" if word == 4 else "<u8")
    # 2^m divides 2^(8 word), so the low m bits of a uniform word are uniform mod 2^m.
    out = (words & np.array(modulus_mask(m), dtype=words.dtype)).astype(np.int64)
    return torch.from_numpy(out)


def _aad(sender: int, receiver: int, round_id: int) -> bytes:
    return sender.to_bytes(4, "big") + receiver.to_bytes(4, "big") + round_bytes(round_id)


def encrypt(key: bytes, plaintext: bytes, *, sender: int, receiver: int, round_id: int,
            entropy: Entropy = os.urandom) -> bytes:
    """``nonce || AES-GCM(key, nonce, plaintext, aad = sender || receiver || round)``."""
    nonce = entropy(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, _aad(sender, receiver, round_id))


def decrypt(key: bytes, ciphertext: bytes, *, sender: int, receiver: int, round_id: int) -> bytes:
    """Inverse of :func:`encrypt`; raises ``cryptography.exceptions.InvalidTag`` if the
    ciphertext was altered or meant for another pair or round."""
    nonce, body = ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:]
    return AESGCM(key).decrypt(nonce, body, _aad(sender, receiver, round_id))
