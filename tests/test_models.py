"""The seed's ResNet-18 in both frameworks: same size, same output shape."""
import numpy as np

from dpscale.model import models


def test_torch_and_flax_resnet18_match_the_book():
    import jax.numpy as jnp
    import torch
    net = models.torch_resnet18()
    assert models.count_torch(net) == models.NUM_PARAMS == 11_175_818
    fmodel = models.flax_resnet18()
    assert models.count_flax(fmodel) == 11_175_818
    out_t = net(torch.zeros(2, 1, 32, 32))
    out_j = fmodel(jnp.zeros((2, 32, 32, 1)))
    assert tuple(out_t.shape) == tuple(np.shape(out_j)) == (2, 10)


def test_flops_are_counted_not_typed():
    # 13.30 GFLOP per sample at 64x64 (h200-baseline.md); quadratic in the side
    f64 = models.torch_flops_per_sample(64)
    assert abs(f64 / 1e9 - 13.30) < 0.01
    assert abs(models.torch_flops_per_sample(32) * 4 / f64 - 1) < 0.01
