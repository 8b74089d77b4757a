"""The compiled loops of COO preprocessing: sort keys, and sorted keys to buffers.

`key_pass` writes every id of a feature as its sort key p | e | low into
the region of its SparseCore q (coo_sort sorts each region). After the
sort, `layout_pass` walks each SC's keys once: it merges the repeats of an
id in a sample (float32 gains summed left to right, as the reference
does), counts entries and distinct rows per partition (the statistics,
before any dropping), applies max_ids/max_unique (a prefix of every
partition stays) and writes the kept entries, the padding and the tail of
every SC's segment in place (docs/reference/coo_format.md "Buffer layout").

Both are compiled with numba on first use in a process (about a second
each), or loaded from numba's cache on disk when the job turned it on
(core/compile_cache.py: every data worker would compile them again). The hot
loops index with unsigned integers (`_u`): numba then skips its
negative-index wraparound, whose extra instructions and registers cost a
quarter of the layout pass; every such index is non-negative by
construction.
"""

from __future__ import annotations

import numpy as np

from sparsepipe.core import compile_cache
from sparsepipe.transforms.coo.buffer_sizes import INT_MAX

_u = np.uint64


@compile_cache.njit(nogil=True)
def key_pass(values, lengths, rows_per_sc, low_base, fields, key, cursors, ends, mark):
  """Appends the keys of one feature's ids to the regions of their SCs.

  fields = (col_shift, col_offset, log_n, low_bits, p_shift, by_position).
  The id's stacked column col = ((id + col_shift) & (N-1)) + (id & ~(N-1))
  + col_offset gives p = col mod N and e = col div N; feature row
  r = q * rows_per_sc + j goes to SC q, and low is the sample id
  low_base + j, or (by_position) low_base + the id's position. SC q's keys
  go to key[cursors[q]:], which advances; key up to ends[q] (the end of
  SC q's region) is set to all ones. mark (int32, zero, longer than any
  SC's ids) marks where samples start: the sample of an id is then a
  running sum, so no loop runs per sample (their exits mispredict).
  """
  col_shift, col_offset, log_n, low_bits, p_shift, by_position = fields
  mask = (1 << log_n) - 1
  i = 0
  r = 0
  for q in range(lengths.shape[0] // rows_per_sc):
    a = i
    for _ in range(rows_per_sc):
      mark[_u(i - a)] += 1
      i += lengths[r]
      r += 1
    n = i - a
    c = cursors[q]
    row = key[c : c + n]
    ids = values[a:i]
    for t in range(n):
      v = np.int64(ids[t])
      col = ((v + col_shift) & mask) + (v & ~mask) + col_offset
      row[t] = ((col & mask) << p_shift) | ((col >> log_n) << low_bits)
    low = low_base - 1
    for t in range(n):
      low += mark[t]
      mark[t] = 0
      row[t] = np.int64(row[t]) | (low_base + a + t if by_position else low)
    mark[n] = 0
    cursors[q] = c + n
    key[c + n : ends[q]] = -1


@compile_cache.njit(nogil=True, inline="always")
def _fill(emb, sid_out, gain_out, start, stop):
  """(INT_MAX, INT_MAX, NaN) in slots [start, stop): padding and segment tails."""
  for s in range(start, stop):
    emb[_u(s)] = INT_MAX
    sid_out[_u(s)] = INT_MAX
    gain_out[_u(s)] = np.nan


def _make_layout_sc(weighted: bool):
  """layout_pass for one SC, compiled for weighted or unweighted keys (a
  closure constant, so the other kind's branches are compiled away: 10%)."""

  @compile_cache.njit(nogil=True)
  def layout_sc(row, base, fields, sample_of, gain_of, limits, out, rows, counts, uniques):
    """One SC: its sorted keys `row`, its segment `out`, its row pointers and
    statistics. Returns (dropped, lost, aligned end).

    Per entry, inline: a call per entry (array reference counts) costs ~4x.
    """
    low_bits, e_bits, p_shift, num_sc = fields
    seg, max_ids, max_unique = limits
    emb, sid_out, gain_out = out
    low_mask = (1 << low_bits) - 1
    e_mask = (1 << e_bits) - 1
    drops = lost = aligned = i = 0
    n = row.shape[0]
    for p in range(num_sc):
      count = unique = kept = 0
      last_e = -1
      while i < n:
        k = np.int64(row[_u(i)])
        if (k >> p_shift) & (num_sc - 1) != p:
          break
        # The run of equal ids from i: unweighted equal keys, gain g + g + ...;
        # weighted equal rows (p, e) of one sample, gains added in position order.
        e = (k >> low_bits) & e_mask
        j = i + 1
        if weighted:
          sid = sample_of[_u(k & low_mask)]
          g = gain_of[_u(k & low_mask)]
          while j < n:
            k2 = np.int64(row[_u(j)])
            if (k2 >> low_bits) != (k >> low_bits) or sample_of[_u(k2 & low_mask)] != sid:
              break
            g += gain_of[_u(k2 & low_mask)]
            j += 1
        else:
          sid = np.int32(k & low_mask)
          g0 = gain_of[_u(base + sid)]
          g = g0
          while j < n and np.int64(row[_u(j)]) == k:
            g += g0
            j += 1
        unique += np.int64(e != last_e)
        last_e = e
        count += 1
        w = aligned + kept
        if count > max_ids or unique > max_unique:
          drops += j - i
        elif w >= seg:
          drops += j - i
          lost += 1
          kept += 1
        else:
          emb[_u(w)] = e
          sid_out[_u(w)] = sid
          gain_out[_u(w)] = g
          kept += 1
        i = j
      counts[p] = count
      uniques[p] = unique
      padded = (kept + 7) & ~7
      _fill(emb, sid_out, gain_out, min(aligned + kept, seg), min(aligned + padded, seg))
      rows[p] = min(aligned + kept, seg)
      aligned += padded
    _fill(emb, sid_out, gain_out, min(aligned, seg), seg)
    rows[num_sc:] = min(aligned, seg)
    return drops, lost, aligned

  return layout_sc


_SC_BY_SAMPLE = _make_layout_sc(False)
_SC_BY_POSITION = _make_layout_sc(True)


@compile_cache.njit(nogil=True)
def layout_pass(key, sc_starts, sc_counts, fields, sample_of, gain_of, limits, out, rows, stats):
  """Writes one stack's buffers and statistics.

  Returns (raw ids dropped, entries past a segment end, the largest entry
  count and distinct count of any partition).

  SC q's keys are key[sc_starts[q]:][:sc_counts[q]], sorted. fields =
  (low_bits, e_bits, p_shift, num_sc, sc_per_device, per_sc, weighted);
  limits = (seg, max_ids, max_unique); out = (embedding ids, sample ids,
  gains) [L*S*seg] and rows the row pointers [L*S, R] to write. stats =
  (counts, uniques) per partition q*N+p, the aligned size each SC needed,
  and the statistics as returned: max_ids and max_unique [L*N] (the max
  over a device's SCs) and required [L*S] (sum of round8(count)).
  Unweighted keys end in the sample id, whose gain on SC q is gain_of[q *
  per_sc + sid]; weighted keys end in the id's position, whose sample and
  gain are sample_of/gain_of[pos].
  """
  low_bits, e_bits, p_shift, num_sc, sc_per_device, per_sc, weighted = fields
  seg = limits[0]
  counts, uniques, needed, max_ids, max_unique, required = stats
  sc_fields = (low_bits, e_bits, p_shift, num_sc)
  max_ids[:] = 0
  max_unique[:] = 0
  drops = lost = top_count = top_unique = 0
  for q in range(sc_starts.shape[0]):
    parts = slice(q * num_sc, (q + 1) * num_sc)
    segment = slice(q * seg, (q + 1) * seg)
    args = (
      key[sc_starts[q] : sc_starts[q] + sc_counts[q]],
      q * per_sc,
      sc_fields,
      sample_of,
      gain_of,
      limits,
      (out[0][segment], out[1][segment], out[2][segment]),
      rows[q],
      counts[parts],
      uniques[parts],
    )
    if weighted:
      d, l, a = _SC_BY_POSITION(*args)
    else:
      d, l, a = _SC_BY_SAMPLE(*args)
    drops += d
    lost += l
    needed[q] = a
    device = (q // sc_per_device) * num_sc
    total = 0
    for p in range(num_sc):
      c, u = counts[q * num_sc + p], uniques[q * num_sc + p]
      max_ids[device + p] = max(max_ids[device + p], c)
      max_unique[device + p] = max(max_unique[device + p], u)
      top_count = max(top_count, c)
      top_unique = max(top_unique, u)
      total += (c + 7) & ~7
    required[q] = total
  return drops, lost, top_count, top_unique
