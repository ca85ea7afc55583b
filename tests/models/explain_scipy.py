"""The torch.compile tutorials' non-PyTorch call: scipy.fft.dct on x.numpy() inside forward."""

import scipy.fft
import torch


class DctFeatures(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.proj(x)
        spectrum = torch.from_numpy(scipy.fft.dct(y.detach().numpy(), axis=-1))
        return torch.relu(spectrum)
