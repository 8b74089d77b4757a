"""Which step pays off on a platform: pipelined where the stages can overlap.

The pipelined step runs the lookup of batch i and the embedding update of
batch i-2 beside the dense step of batch i-1, in one program, so that a
device with independent units (or several devices exchanging ids while
they compute) keeps them all busy. Where nothing can run beside the dense
step, pipelining only adds work: the two sparse stages see different
batches, so the id exchange and sort that a sequential step shares
between lookup and update of one batch run twice, and the activations,
gradients and inputs of two batches are carried between steps. On CPU
the devices share the host's cores, and a single device has no exchange
to hide (benchmarks/step.py --sections modes times both steps).
"""

from __future__ import annotations

# jax platform names of devices whose sparse and dense stages can overlap
# (CUDA and ROCm devices report "gpu").
OVERLAPPING_PLATFORMS = ("gpu", "tpu")


def pipelining_pays_off(platform: str, device_count: int) -> bool:
  """Whether the pipelined step is the default on `device_count` devices of `platform`.

  True only on more than one GPU or TPU device; CPU devices and a single
  device run the sequential step (lookup, dense step and update of one
  batch, in order), which does less work there.
  """
  return platform in OVERLAPPING_PLATFORMS and device_count > 1
