"""The compiled loops of COO preprocessing: sort keys, and sorted keys to buffers.

`key_pass` packs every id of a feature into its sort key in one loop. After
the sort, `layout_pass` walks the sorted keys (fields p | e | low, SC by SC)
once: it merges the repeats of an id in a sample (float32 gains summed left
to right, as the reference does), counts entries and distinct rows per
partition (the statistics, before any dropping), applies max_ids/max_unique
(a prefix of every partition stays) and writes the kept entries, the
padding and the tail of every SC's segment in place (docs/coo_format.md
"Buffer layout").

Both are compiled with numba on first use in a process (about a second
each; not cached on disk, whose cache files would be pickles): the same
work as some 30 vectorised numpy passes, each in one pass with no
temporaries (benchmarks/preprocess.py).
"""

from __future__ import annotations

import numba
import numpy as np

from sparsepipe.transforms.coo.layout import INT_MAX


@numba.njit(nogil=True)
def key_pass(values, lengths, rows_per_sc, low_base, fields, key):
  """key[i] = [q << q_shift |] p << p_shift | e << low_bits | low for every id i.

  fields = (col_shift, col_offset, log_n, low_bits, p_shift, q_shift,
  by_position). The id's stacked column col = ((id + col_shift) & (N-1)) +
  (id & ~(N-1)) + col_offset gives p = col mod N and e = col div N; row
  r = q * rows_per_sc + j holds the id; low is the sample id low_base + j,
  or low_base + i by_position. q_shift < 0 leaves q out.
  """
  col_shift, col_offset, log_n, low_bits, p_shift, q_shift, by_position = fields
  mask = (1 << log_n) - 1
  i = 0
  r = 0
  for q in range(lengths.shape[0] // rows_per_sc):
    high = q << q_shift if q_shift >= 0 else 0
    for j in range(rows_per_sc):
      stop = i + lengths[r]
      r += 1
      row_high = high if by_position else high | (low_base + j)
      for t in range(i, stop):
        v = np.int64(values[t])
        col = ((v + col_shift) & mask) + (v & ~mask) + col_offset
        k = row_high | ((col & mask) << p_shift) | ((col >> log_n) << low_bits)
        key[t] = k | (low_base + t) if by_position else k
      i = stop


@numba.njit(nogil=True)
def _fill(out, start, stop):
  """(INT_MAX, INT_MAX, NaN) in slots [start, stop): padding and segment tails."""
  emb, sid_out, gain_out = out
  for s in range(start, stop):
    emb[s] = INT_MAX
    sid_out[s] = INT_MAX
    gain_out[s] = np.nan


@numba.njit(nogil=True)
def _layout_sc(key, q, fields, sample_of, gain_of, limits, out, rows, stats):
  """layout_pass for SC q (the keys [q_starts[q], q_starts[q+1])): (dropped, lost).

  Per entry, inline: a call per entry (array reference counts) costs ~4x.
  """
  low_bits, e_bits, p_shift, num_sc, per_sc, weighted = fields
  seg, max_ids, max_unique = limits
  emb, sid_out, gain_out = out
  q_starts, counts, uniques, needed = stats
  low_mask = (1 << low_bits) - 1
  e_mask = (1 << e_bits) - 1
  drops = lost = 0
  base = q * seg
  aligned = 0
  i, end = q_starts[q], q_starts[q + 1]
  for p in range(num_sc):
    count = unique = kept = 0
    last_e = -1
    while i < end and (np.int64(key[i]) >> p_shift) & (num_sc - 1) == p:
      # The run of equal ids from i: unweighted equal keys, gain g + g + ...;
      # weighted equal rows (p, e) of one sample, gains added in position order.
      k = np.int64(key[i])
      e = (k >> low_bits) & e_mask
      j = i + 1
      if weighted:
        sid = sample_of[k & low_mask]
        g = gain_of[k & low_mask]
        while j < end:
          k2 = np.int64(key[j])
          if (k2 >> low_bits) != (k >> low_bits) or sample_of[k2 & low_mask] != sid:
            break
          g += gain_of[k2 & low_mask]
          j += 1
      else:
        sid = np.int32(k & low_mask)
        g0 = gain_of[q * per_sc + sid]
        g = g0
        while j < end and np.int64(key[j]) == k:
          g += g0
          j += 1
      if e != last_e:
        unique += 1
        last_e = e
      count += 1
      if count > max_ids or unique > max_unique:
        drops += j - i
      elif aligned + kept >= seg:
        drops += j - i
        lost += 1
        kept += 1
      else:
        emb[base + aligned + kept] = e
        sid_out[base + aligned + kept] = sid
        gain_out[base + aligned + kept] = g
        kept += 1
      i = j
    counts[q * num_sc + p] = count
    uniques[q * num_sc + p] = unique
    padded = (kept + 7) & ~7
    _fill(out, base + min(aligned + kept, seg), base + min(aligned + padded, seg))
    rows[q, p] = min(aligned + kept, seg)
    aligned += padded
  _fill(out, base + min(aligned, seg), base + seg)
  rows[q, num_sc:] = min(aligned, seg)
  needed[q] = aligned
  return drops, lost


@numba.njit(nogil=True)
def layout_pass(key, q_starts, fields, sample_of, gain_of, limits, out, rows, stats):
  """Writes one stack's buffers; returns (raw ids dropped, entries past a segment end).

  fields = (low_bits, e_bits, p_shift, num_sc, per_sc, weighted); limits =
  (seg, max_ids, max_unique); out = (embedding ids, sample ids, gains) and
  rows the row pointers [L*S, R] to write; stats = (counts, uniques) per
  partition q*N+p and the aligned size each SC needed, to write. The keys of
  SC q are key[q_starts[q]:q_starts[q+1]]. Unweighted keys end in the sample
  id, whose gain on SC q is gain_of[q * per_sc + sid]; weighted keys end in
  the id's position, whose sample and gain are sample_of/gain_of[pos].
  """
  drops = lost = 0
  for q in range(q_starts.shape[0] - 1):
    d, l = _layout_sc(key, q, fields, sample_of, gain_of, limits, out, rows, (q_starts, *stats))
    drops += d
    lost += l
  return drops, lost
