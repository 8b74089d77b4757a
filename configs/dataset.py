"""The shipped 'dataset' config by path; it lives in sparsepipe/launch/config/shipped/dataset.py.

`python -m sparsepipe.launch --config=configs/dataset.py` (from a checkout) and
`--config=dataset` (anywhere the package is installed) load the same config.
"""

from sparsepipe.launch.config.shipped.dataset import get_config  # noqa: F401
