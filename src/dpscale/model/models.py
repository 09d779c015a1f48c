"""The seed's ResNet-18 (d2l's variant: 1 input channel, 3x3 stem, no max-pool,
4 stages of 2 residual blocks, global average pool, linear), in PyTorch and in
Flax NNX, without the d2l package. Both have 11,175,818 parameters.

torch and flax are imported lazily: a PyTorch rank never pays for importing JAX.
"""
from __future__ import annotations

NUM_PARAMS = 11_175_818
STAGES = ((64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2))  # (in, out, stride)


def torch_resnet18(num_classes: int = 10, in_channels: int = 1):
    from torch import nn
    from torch.nn import functional as F

    class Residual(nn.Module):
        # d2l's block: convs keep their bias (d2l uses LazyConv2d defaults).
        def __init__(self, cin, cout, use_1x1conv=False, stride=1):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, stride=stride)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.conv3 = nn.Conv2d(cin, cout, 1, stride=stride) if use_1x1conv else None
            self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            if self.conv3 is not None:
                x = self.conv3(x)
            return F.relu(y + x)

    def stage(cin, cout, stride):
        first = Residual(cin, cout, use_1x1conv=stride != 1, stride=stride)
        return nn.Sequential(first, Residual(cout, cout))

    net = nn.Sequential(nn.Conv2d(in_channels, 64, 3, stride=1, padding=1),
                        nn.BatchNorm2d(64), nn.ReLU())
    for i, (cin, cout, stride) in enumerate(STAGES, 1):
        net.add_module(f"resnet_block{i}", stage(cin, cout, stride))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net


def residual_stages(net):
    """The four residual stages of torch_resnet18: FSDP shards each one."""
    return [getattr(net, f"resnet_block{i}") for i in range(1, 5)]


def flax_resnet18(num_classes: int = 10, seed: int = 0):
    from flax import nnx

    class Residual(nnx.Module):
        def __init__(self, cin, cout, use_1x1conv=False, strides=(1, 1), *, rngs):
            self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=strides, padding="same", rngs=rngs)
            self.conv2 = nnx.Conv(cout, cout, (3, 3), padding="same", rngs=rngs)
            self.conv3 = (nnx.Conv(cin, cout, (1, 1), strides=strides, rngs=rngs)
                          if use_1x1conv else None)
            self.bn1 = nnx.BatchNorm(cout, rngs=rngs)
            self.bn2 = nnx.BatchNorm(cout, rngs=rngs)

        def __call__(self, x):
            y = nnx.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            if self.conv3 is not None:
                x = self.conv3(x)
            return nnx.relu(y + x)

    class ResNet18(nnx.Module):
        def __init__(self, rngs):
            layers = [nnx.Conv(1, 64, (3, 3), (1, 1), padding="same", rngs=rngs),
                      nnx.BatchNorm(64, rngs=rngs), nnx.relu]
            for cin, cout, s in STAGES:
                layers += [Residual(cin, cout, use_1x1conv=s != 1, strides=(s, s), rngs=rngs),
                           Residual(cout, cout, rngs=rngs)]
            layers += [lambda x: x.mean(axis=(1, 2)), nnx.Linear(512, num_classes, rngs=rngs)]
            self.net = nnx.Sequential(*layers)

        def __call__(self, x):  # x: NHWC
            return self.net(x)

    return ResNet18(nnx.Rngs(seed))


def count_torch(net) -> int:
    return sum(p.numel() for p in net.parameters())


def count_flax(model) -> int:
    import jax
    from flax import nnx
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def torch_flops_per_sample(image_size: int, device="cpu") -> int:
    """Forward+backward FLOPs per sample, counted by torch.utils.flop_counter
    (2 FLOPs per multiply-add). Never typed in: MFU is computed from this."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    net = torch_resnet18().to(device)
    x = torch.zeros(2, 1, image_size, image_size, device=device)
    with FlopCounterMode(display=False) as counter:
        net(x).sum().backward()
    return counter.get_total_flops() // 2


def read_flops(path, image_size: int) -> int:
    """The count rule model_flops wrote (model_flops_record), checked against the image
    size the protocol asks for: counted once per DAG, read by every job that needs it."""
    import json
    with open(path) as f:
        rec = json.load(f)
    if rec["image_size"] != image_size:
        raise ValueError(f"{path} counts {rec['image_size']}px images, the protocol asks for {image_size}px")
    return int(rec["flops_per_sample"])


def model_flops_record(image_size: int) -> dict:
    """What scripts/flops.py writes: the count, how it was made, and for which model."""
    import torch
    return {"image_size": image_size, "flops_per_sample": torch_flops_per_sample(image_size),
            "counted_by": "torch.utils.flop_counter.FlopCounterMode, forward+backward, batch 2, divided by 2",
            "parameters": count_torch(torch_resnet18()), "torch": torch.__version__}
