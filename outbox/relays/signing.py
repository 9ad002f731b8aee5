"""Standard Webhooks signatures (https://www.standardwebhooks.com), as the webhook relay
sends them and any Standard Webhooks library verifies them.

Each request carries ``webhook-id`` (the message id, the same on every retry: the
consumer's idempotency key), ``webhook-timestamp`` (Unix seconds, when it was sent) and
``webhook-signature``: ``v1,`` followed by the base64 HMAC-SHA256 of
``{id}.{timestamp}.{body}`` under the signing key. A secret is given as ``whsec_`` plus
the base64 of the key (the form Standard Webhooks hands out), or as the base64 alone, or
as the raw key in bytes. Several secrets (while one is rotated out) sign with each key,
the signatures separated by spaces, so the consumer accepts either.

A key has at least `MIN_KEY_BYTES` bytes. Standard Webhooks generates keys of 24 to 64
random bytes, so every key its tools hand out is accepted; a shorter key is refused,
since anyone holding one signed request can guess a short key offline and then sign
requests of their own.

A receiver verifies ``webhook-signature`` against the same id, timestamp and body, and
refuses a ``webhook-timestamp`` more than 5 minutes from its own clock, either way, as
the Standard Webhooks libraries do: a captured request cannot be replayed later. Each
attempt is signed when it is sent, so a retry hours later still verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

__all__ = ["MIN_KEY_BYTES", "Secret", "signature_headers", "signing_keys"]

PREFIX = "whsec_"
# The shortest key Standard Webhooks generates (its keys are 24 to 64 random bytes).
MIN_KEY_BYTES = 24

# One secret, or several while a secret is rotated.
Secret = str | bytes | Sequence[str | bytes]


def signing_keys(secret: Secret) -> list[bytes]:
    """The HMAC keys of `secret`. Raises ValueError, whose text never repeats the secret,
    when one does not decode or is shorter than `MIN_KEY_BYTES`."""
    secrets = [secret] if isinstance(secret, (str, bytes)) else list(secret)
    if not secrets:
        raise ValueError("no secret given")
    return [_key(one, position) for position, one in enumerate(secrets, 1)]


def _key(secret: object, position: int) -> bytes:
    which = f"secret #{position}"
    if isinstance(secret, bytes):
        key = secret
    elif isinstance(secret, str):
        text = secret.removeprefix(PREFIX)
        try:
            # Standard Webhooks secrets are often written without their '=' padding.
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                f"{which} does not decode: it is not '{PREFIX}' followed by base64 (nor "
                f"base64 alone); give the key itself as bytes if it is not base64"
            ) from None
    else:
        raise ValueError(f"{which} is a {type(secret).__name__}, not a str or bytes")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{which} is a key of {len(key)} byte(s): use one of at least "
            f"{MIN_KEY_BYTES} bytes, random ('{PREFIX}' and the base64 of 24 to 64 random "
            f"bytes, as Standard Webhooks generates them)"
        )
    return key


def signature_headers(
    keys: Sequence[bytes], message_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three Standard Webhooks headers of one request."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    signatures = (
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for key in keys
    )
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signatures),
    }
