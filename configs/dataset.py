"""The shipped 'dataset' config by path; it lives in sparsepipe/launch/configs/dataset.py.

`python -m sparsepipe.launch --config=configs/dataset.py` (from a checkout) and
`--config=dataset` (anywhere the package is installed) load the same config.
"""

from sparsepipe.launch.configs.dataset import get_config  # noqa: F401
