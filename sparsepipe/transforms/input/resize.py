"""Input iterator states across a change of the process count.

Host h of P reads a contiguous block of every global batch
(grain_host_blocks), so after K global batches the data position is global:
every host has read K blocks of its share. With the same global batch, the
states of N processes therefore map to those of M processes: host h' of M
continues at K of its own blocks. The FDO maxima are per local device
(shapes L*N and L*S per stack); the global device d's samples are the same
rows of every global batch on any process count, so concatenating the
saved hosts' arrays in process order and cutting them into M parts keeps
each device's numbers (when the device count is unchanged). Counters of
corrupt records and dropped ids are sums over hosts: their totals go to
process 0.

What cannot be converted is refused with IteratorStateMismatchError:
another global batch, a different worker count, Grain workers (their
batches interleave per-process record streams), a per-host batch that is
not whole records (hosts then read strided records), and hosts that are
not at one global batch boundary.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from sparsepipe.transforms.input.record_stats import StatsTotals
from sparsepipe.transforms.input.record_stats import clear_stats_maxima
from sparsepipe.transforms.input.record_stats import find_stats_node
from sparsepipe.transforms.input.record_stats import map_stats_node
from sparsepipe.transforms.input.host_input import IteratorStateMismatchError

# Metadata that differs between the processes of one run, or with their count.
_PER_PROCESS_KEYS = ("process_index", "process_count", "per_host_batch_size")
_DECODE_KEYS = ("next_record", "offset")


def _ordered(saved: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  """The saved states in process order, checked to be one complete run."""
  if not saved:
    raise IteratorStateMismatchError("no saved data iterator states to convert")
  count = len(saved)
  by_index = {}
  for state in saved:
    meta = state["metadata"]
    if meta.get("process_count") != count:
      raise IteratorStateMismatchError(
        f"a data iterator state has process_count={meta.get('process_count')!r}, but"
        f" {count} states were given: pass the states of every saved process"
      )
    by_index[meta.get("process_index")] = state
  if sorted(by_index, key=str) != list(range(count)):
    raise IteratorStateMismatchError(
      f"the saved data iterator states have process indices {sorted(by_index, key=str)},"
      f" expected 0..{count - 1}"
    )
  return [by_index[i] for i in range(count)]


def _check_metadata(saved: list[Mapping[str, Any]], target: Mapping[str, Any]) -> None:
  """Same data, seed, workers and global batch in every saved state and the target."""
  for key in sorted(set(target) - set(_PER_PROCESS_KEYS)):
    for i, state in enumerate(saved):
      value = state["metadata"].get(key)
      if value != target[key]:
        hint = ""
        if key == "num_workers":
          hint = ": batches depend on the worker count, restore with the same num_workers"
        raise IteratorStateMismatchError(
          f"data iterator state of process {i} was saved with {key}={value!r}, but this"
          f" pipeline has {key}={target[key]!r}{hint}"
        )
  old = [int(s["metadata"]["per_host_batch_size"]) for s in saved]
  if len(set(old)) != 1:
    raise IteratorStateMismatchError(f"the saved processes have per_host_batch_size={old}")
  saved_global = old[0] * len(saved)
  new_global = int(target["per_host_batch_size"]) * int(target["process_count"])
  if saved_global != new_global:
    raise IteratorStateMismatchError(
      f"the checkpoint's global batch is {saved_global} ({len(saved)} processes x"
      f" {old[0]}), but this job's is {new_global} ({target['process_count']} x"
      f" {target['per_host_batch_size']}): resume with global_batch_size={saved_global}"
    )


def _records_per_batch(per_host: int, examples_per_record: int | None, what: str) -> int:
  if not isinstance(examples_per_record, int) or examples_per_record < 1:
    raise ValueError(
      f"examples_per_record={examples_per_record!r} must be the dataset's positive"
      " manifest.examples_per_record"
    )
  records, rest = divmod(int(per_host), int(examples_per_record))
  if rest:
    raise IteratorStateMismatchError(
      f"{what} per_host_batch_size={per_host} is not a multiple of the dataset's"
      f" examples_per_record={examples_per_record}: hosts then read strided records,"
      " so the data position depends on the process count; resume on the saved"
      " number of processes"
    )
  return records


def _global_position(saved: list[Mapping[str, Any]], block: int) -> int:
  """K: the global batches every saved process (0 workers) has consumed."""
  consumed = []
  for i, state in enumerate(saved):
    node = find_stats_node(state["pipeline"])
    decode, batches = node["parent"], int(node["totals"]["batches"])
    if not isinstance(decode, Mapping) or set(decode) != set(_DECODE_KEYS):
      raise IteratorStateMismatchError(
        f"data iterator state of process {i} has no record position under its"
        f" statistics stage (found {decode!r})"
      )
    if decode["offset"] != 0 or decode["next_record"] != batches * block:
      raise IteratorStateMismatchError(
        f"data iterator state of process {i} is at record {decode['next_record']},"
        f" offset {decode['offset']} after {batches} batches of {block} records: not at"
        " a global batch boundary (corrupt records skipped?); resume on the saved"
        " number of processes"
      )
    consumed.append(batches)
  if len(set(consumed)) != 1:
    raise IteratorStateMismatchError(
      f"the saved processes consumed different numbers of batches {consumed}: not one"
      " global position; resume on the saved number of processes"
    )
  return consumed[0]


def _split_maxima(
  saved: list[StatsTotals], count: int, index: int
) -> dict[str, dict[str, np.ndarray]]:
  """Process `index` of `count`'s share of the saved per-device maxima."""
  out = {}
  for field, first in saved[0].maxima.items():
    stacks = sorted(first)
    for i, totals in enumerate(saved):
      if sorted(totals.maxima[field]) != stacks:
        raise IteratorStateMismatchError(
          f"FDO totals of process {i} have {field} for stacks"
          f" {sorted(totals.maxima[field])}, process 0 for {stacks}"
        )
    out[field] = {}
    for stack in stacks:
      joined = np.concatenate([totals.maxima[field][stack] for totals in saved])
      if joined.size % count:
        raise IteratorStateMismatchError(
          f"stack '{stack}': {field} has {joined.size} entries over all saved processes,"
          f" not divisible by {count} processes: the device count changed, reset the"
          " FDO maxima (reset_stats_maxima=True)"
        )
      out[field][stack] = np.split(joined, count)[index]
  return out


def _converted_totals(
  saved: list[Mapping[str, Any]], count: int, index: int, reset_maxima: bool
) -> dict[str, Any]:
  """The new process's FDO totals: its share of the maxima, the counters on process 0."""
  old = [StatsTotals.from_state(find_stats_node(s["pipeline"])["totals"]) for s in saved]
  totals = StatsTotals()
  totals.batches = old[0].batches
  if not reset_maxima:
    totals.maxima = _split_maxima(old, count, index)
  if index == 0:
    totals.corrupt_records = sum(t.corrupt_records for t in old)
    for t in old:
      for stack, drops in t.id_drops.items():
        totals.id_drops[stack] = totals.id_drops.get(stack, 0) + drops
  else:
    totals.id_drops = {stack: 0 for t in old for stack in t.id_drops}
  return totals.to_state()


def resize_iterator_state(
  saved: Sequence[Mapping[str, Any]],
  target: Mapping[str, Any],
  *,
  examples_per_record: int | None,
  reset_stats_maxima: bool = False,
) -> dict[str, Any]:
  """The state for a new pipeline from every saved process's iterator state.

  Args:
    saved: get_state() of each of the N saved processes (any order).
    target: the new pipeline's metadata (InputPipelineIterator.metadata): its
      process_index, process_count M and per_host_batch_size say which state
      to make; everything else must match the saved states.
    examples_per_record: the dataset's R (manifest.examples_per_record, or
      InputPipelineIterator.examples_per_record); unused if N == M.
    reset_stats_maxima: forget the FDO maxima (pass True when the global
      device count changed: their shapes follow the device layout).

  Returns:
    A state for target's process; set_state continues it where an
    uninterrupted M-process run would be after the same global batches.

  Raises:
    IteratorStateMismatchError: what differs and what to do (see the module).
  """
  saved = _ordered(saved)
  _check_metadata(saved, target)
  count, index = int(target["process_count"]), int(target["process_index"])
  if count == len(saved):
    state = saved[index]
    if reset_stats_maxima:
      state = {**state, "pipeline": clear_stats_maxima(state["pipeline"])}
    return {"metadata": dict(state["metadata"]), "pipeline": state["pipeline"]}
  workers = int(target["num_workers"])
  if workers:
    raise IteratorStateMismatchError(
      f"with num_workers={workers} each process's batches interleave its workers'"
      f" record streams, so a data position of {len(saved)} processes has no"
      f" equivalent on {count}: resume on {len(saved)} processes (or train with"
      " data.num_workers=0 to change the process count)"
    )
  old_block = _records_per_batch(
    saved[0]["metadata"]["per_host_batch_size"], examples_per_record, "the saved"
  )
  new_block = _records_per_batch(target["per_host_batch_size"], examples_per_record, "the new")
  consumed = _global_position(saved, old_block)
  node = {
    "parent": {"next_record": consumed * new_block, "offset": 0},
    "totals": _converted_totals(saved, count, index, reset_stats_maxima),
  }
  metadata = dict(saved[0]["metadata"])
  metadata.update({key: target[key] for key in _PER_PROCESS_KEYS})
  return {"metadata": metadata, "pipeline": map_stats_node(saved[0]["pipeline"], lambda _: node)}


def resize_iterator_states(
  saved: Sequence[Mapping[str, Any]],
  process_count: int,
  *,
  examples_per_record: int | None,
  reset_stats_maxima: bool = False,
) -> list[dict[str, Any]]:
  """The M = process_count states, same global batch, from the N saved ones.

  resize_iterator_state for every new process, whose metadata is the
  saved one with the new process index, count and per-host batch.
  """
  ordered = _ordered(saved)
  global_batch = int(ordered[0]["metadata"]["per_host_batch_size"]) * len(ordered)
  per_host, rest = divmod(global_batch, max(int(process_count), 1))
  if rest or process_count < 1:
    raise IteratorStateMismatchError(
      f"the global batch {global_batch} does not split over {process_count} processes"
    )
  states = []
  for index in range(process_count):
    target = dict(ordered[0]["metadata"])
    target.update(process_index=index, process_count=process_count, per_host_batch_size=per_host)
    states.append(
      resize_iterator_state(
        ordered,
        target,
        examples_per_record=examples_per_record,
        reset_stats_maxima=reset_stats_maxima,
      )
    )
  return states
