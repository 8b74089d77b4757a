"""Input iterator states across a change of the process count.

A batch is a function of its global index (train_batches.py), so the data
position, `next_batch`, is the same number on every process and on any
process count: with the same global batch, host h' of M simply continues
at the saved `next_batch`. The FDO maxima are per local device (shapes L*N
and L*S per stack); the global device d's samples are the same rows of
every global batch on any process count, so concatenating the saved hosts'
arrays in process order and cutting them into M parts keeps each device's
numbers (when the device count is unchanged). Counters of corrupt records
and dropped ids are sums over hosts: their totals go to process 0.

What cannot be converted is refused with IteratorStateMismatchError:
another global batch, other data or seed, states of different positions.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from sparsepipe.transforms.input.iterator import ADDED_METADATA_KEYS
from sparsepipe.transforms.input.iterator import IteratorStateMismatchError
from sparsepipe.transforms.input.stats import StatsTotals

# Metadata that differs between the processes of one run, or with their count.
_PER_PROCESS_KEYS = ("process_index", "process_count", "per_host_batch_size")


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
  """Same data, seed and global batch in every saved state and the target."""
  for key in sorted(set(target) - set(_PER_PROCESS_KEYS)):
    for i, state in enumerate(saved):
      if key in ADDED_METADATA_KEYS and key not in state["metadata"]:
        continue
      value = state["metadata"].get(key)
      if value != target[key]:
        raise IteratorStateMismatchError(
          f"data iterator state of process {i} was saved with {key}={value!r}, but this"
          f" pipeline has {key}={target[key]!r}"
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


def _global_position(saved: list[Mapping[str, Any]]) -> int:
  """The next global batch of the saved processes (one number for all of them)."""
  positions = [int(s["next_batch"]) for s in saved]
  if len(set(positions)) != 1:
    raise IteratorStateMismatchError(
      f"the saved processes are at different batches {positions}: not one global position"
    )
  return positions[0]


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
          f" not divisible by {count} processes: the device count changed, summarize the"
          " FDO maxima (summarize_stats_maxima=True)"
        )
      out[field][stack] = np.split(joined, count)[index]
  return out


def _summarized_maxima(saved: list[StatsTotals]) -> dict[str, dict[str, np.ndarray]]:
  """Each stack's maximum of each field over every saved process, as a 1-entry array."""
  out: dict[str, dict[str, np.ndarray]] = {}
  for totals in saved:
    for field, stacks in totals.maxima.items():
      for stack, values in stacks.items():
        m = int(values.max()) if values.size else 0
        old = out.setdefault(field, {}).get(stack)
        out[field][stack] = np.array([m if old is None else max(m, int(old[0]))], np.int64)
  return out


def _converted_totals(
  saved: list[Mapping[str, Any]], count: int, index: int, summarize: bool
) -> dict[str, Any]:
  """The new process's FDO totals: its share of the maxima, the counters on process 0."""
  old = [StatsTotals.from_state(s["stats"]) for s in saved]
  totals = StatsTotals()
  totals.batches = old[0].batches
  totals.maxima = _summarized_maxima(old) if summarize else _split_maxima(old, count, index)
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
  summarize_stats_maxima: bool = False,
) -> dict[str, Any]:
  """The state for a new pipeline from every saved process's iterator state.

  Args:
    saved: get_state() of each of the N saved processes (any order).
    target: the new pipeline's metadata (InputIterator.metadata): its
      process_index, process_count M and per_host_batch_size say which state
      to make; everything else must match the saved states.
    summarize_stats_maxima: keep each stack's maximum of each FDO field over
      all saved processes as a 1-entry array (pass True when the global
      device count changed: the arrays' shapes follow the device layout;
      InputIterator.carry_stats_maxima then maps them to the new one).

  Returns:
    A state for target's process; set_state continues it where an
    uninterrupted M-process run would be after the same global batches.

  Raises:
    IteratorStateMismatchError: what differs (see the module docstring).
  """
  saved = _ordered(saved)
  _check_metadata(saved, target)
  count, index = int(target["process_count"]), int(target["process_index"])
  if count == len(saved) and not summarize_stats_maxima:
    return {**saved[index], "metadata": dict(saved[index]["metadata"])}
  stats = _converted_totals(saved, count, index, summarize_stats_maxima)
  metadata = dict(saved[0]["metadata"])
  metadata.update({key: target[key] for key in _PER_PROCESS_KEYS})
  return {"metadata": metadata, "next_batch": _global_position(saved), "stats": stats}


def resize_iterator_states(
  saved: Sequence[Mapping[str, Any]],
  process_count: int,
  *,
  summarize_stats_maxima: bool = False,
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
        summarize_stats_maxima=summarize_stats_maxima,
      )
    )
  return states
