"""dpscale: the library behind the multi-GPU data-parallel scaling pipeline.

Modules are light to import (no torch/jax at import time) except `models`,
`torch_runs` and `jax_runs`, which the measurement scripts import.
"""

__version__ = "0.1.0"
