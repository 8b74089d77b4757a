"""The shipped 'criteo' config by path; it lives in sparsepipe/launch/configs/criteo.py.

`python -m sparsepipe.launch --config=configs/criteo.py` (from a checkout) and
`--config=criteo` (anywhere the package is installed) load the same config.
"""

from sparsepipe.launch.configs.criteo import get_config  # noqa: F401
