"""The torch.compile tutorials' FeaturePyramid exactly as written: flatten gives 64*112*112 =
802816 features to a Linear(64, 10)."""

import torch


class FeaturePyramid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Conv2d(3, 64, kernel_size=5, stride=2, padding=2)
        self.decoder = torch.nn.Linear(64, 10)

    def forward(self, x):
        encoded = torch.relu(self.encoder(x))
        pooled = torch.flatten(encoded, start_dim=1)
        return self.decoder(pooled)
