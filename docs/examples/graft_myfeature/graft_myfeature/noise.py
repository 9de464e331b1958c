"""The feature's torch code, imported only when the feature is on."""

import torch


@torch.no_grad()
def add_noise(model: torch.nn.Module, std: float, *, seed: int) -> None:
    """Add Gaussian noise of standard deviation ``std`` to every weight, reproducibly."""
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        noise = torch.randn(param.shape, generator=generator) * std
        param.add_(noise.to(param.device, param.dtype))
