"""The Orbax handler of the "metadata" item: JSON written in the background.

Like Orbax's JsonCheckpointHandler, but values may be device arrays: the
fingerprints of the saved state, possibly still being computed when `save`
returns. The background commit fetches them, so `save` never waits for
their values. The file is plain JSON, written by the primary process only.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, List, Mapping, Optional

import jax
import orbax.checkpoint as ocp
from etils import epath

from sparsepipe.checkpointing import fingerprint
from sparsepipe.checkpointing import integrity

METADATA_FILENAME = "metadata.json"


def _resolve(value: Any) -> Any:
  """Device fingerprints -> hex strings; other values unchanged."""
  if isinstance(value, jax.Array):
    return fingerprint.to_hex(value)
  if isinstance(value, Mapping):
    return {k: _resolve(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_resolve(v) for v in value]
  return value


class MetadataHandler(ocp.handlers.AsyncCheckpointHandler):
  """Saves a JSON object whose device-array leaves are resolved at commit.

  The written object is sealed with its own sha256 (integrity.seal);
  `restore` returns it as read, the caller unseals it.
  """

  def _write(self, directory: epath.Path, item: Mapping[str, Any]) -> None:
    if jax.process_index() != 0:
      return
    data = integrity.seal(_resolve(item))
    (directory / METADATA_FILENAME).write_text(json.dumps(data, indent=1))

  async def async_save(
      self, directory: epath.Path, args: "MetadataSave"
  ) -> Optional[List[ocp.future.Future]]:
    async def commit():
      self._write(directory, args.item)

    return [
        ocp.future.CommitFutureAwaitingContractedSignals(
            commit(), name="sparsepipe_metadata_save"
        )
    ]

  def save(self, directory: epath.Path, args: "MetadataSave") -> None:
    self._write(directory, args.item)

  def restore(
      self, directory: epath.Path, args: Optional["MetadataRestore"] = None
  ) -> Any:
    del args
    path = directory / METADATA_FILENAME
    if not path.exists():
      raise FileNotFoundError(f"{path} does not exist")
    return json.loads(path.read_text())

  def metadata(self, directory: epath.Path) -> None:
    del directory
    return None

  def finalize(self, directory: epath.Path) -> None:
    del directory

  def close(self) -> None:
    pass


@ocp.args.register_with_handler(MetadataHandler, for_save=True)
@dataclasses.dataclass
class MetadataSave(ocp.args.CheckpointArgs):
  item: Mapping[str, Any]


@ocp.args.register_with_handler(MetadataHandler, for_restore=True)
@dataclasses.dataclass
class MetadataRestore(ocp.args.CheckpointArgs):
  pass
