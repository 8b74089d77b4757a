"""Digests of the JSON parts of a checkpoint (metadata, FDO, iterator state).

A garbled digit in a JSON file still parses; a sha256 of the canonical JSON
(sorted keys, no spaces) written at save time catches it on restore.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from sparsepipe.checkpointing.checkpoint_errors import CorruptCheckpointError

DIGEST_KEY = "sha256"


def canonical_json(value: Any) -> str:
  """Deterministic JSON text: sorted keys, no whitespace, tuples as lists."""
  return json.dumps(value, sort_keys=True, separators=(",", ":"))


def digest(value: Any) -> str:
  """sha256 hex of the canonical JSON of `value`."""
  return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def seal(data: Mapping[str, Any]) -> dict[str, Any]:
  """`data` plus its own digest under DIGEST_KEY."""
  if DIGEST_KEY in data:
    raise ValueError(f"metadata may not use the reserved key '{DIGEST_KEY}'")
  return {**data, DIGEST_KEY: digest(dict(data))}


def unseal(data: Any, *, what: str, where: str) -> dict[str, Any]:
  """The sealed object without its digest; CorruptCheckpointError if altered."""
  if not isinstance(data, Mapping) or DIGEST_KEY not in data:
    raise CorruptCheckpointError(f"{where}: {what} carries no {DIGEST_KEY}")
  body = {k: v for k, v in data.items() if k != DIGEST_KEY}
  if digest(body) != data[DIGEST_KEY]:
    raise CorruptCheckpointError(f"{where}: {what} does not match its {DIGEST_KEY} (file altered)")
  return body


def check_digest(value: Any, expected: str, *, what: str, where: str) -> None:
  """CorruptCheckpointError if `value` is not what was saved."""
  if digest(value) != expected:
    raise CorruptCheckpointError(
      f"{where}: {what} does not match the digest saved with it (file altered)"
    )
