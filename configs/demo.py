"""The shipped 'demo' config by path; it lives in sparsepipe/launch/config/shipped/demo.py.

`python -m sparsepipe.launch --config=configs/demo.py` (from a checkout) and
`--config=demo` (anywhere the package is installed) load the same config.
"""

from sparsepipe.launch.config.shipped.demo import get_config  # noqa: F401
