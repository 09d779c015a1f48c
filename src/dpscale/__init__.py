"""dpscale: the library behind the multi-GPU data-parallel scaling pipeline.

Modules are light to import (no torch/jax at import time) except the measurements'
own: `torch_job`, `torch_ddp`, `torch_comm`, `torch_fsdp`, `jax_job`, `jax_weak`,
`jax_checks` (and the tuned
model's `tuned_model`, `triton_bn`, `layer_profile`, `tuned_probe`).
"""

__version__ = "0.1.0"
