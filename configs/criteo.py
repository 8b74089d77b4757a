"""The shipped 'criteo' config by path; it lives in sparsepipe/launch/config/shipped/criteo.py.

`python -m sparsepipe.launch --config=configs/criteo.py` (from a checkout) and
`--config=criteo` (anywhere the package is installed) load the same config.
"""

from sparsepipe.launch.config.shipped.criteo import get_config  # noqa: F401
