"""The torch.compile tutorials' feed-forward network: 128 -> 256 -> 10 (the demo model).

aotc export examples/mlp.py --input-shape 32x128 -o mlp.pt2
"""

import torch
import torch.nn as nn


class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(128, 256)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = self.fc1(x)
        x = self.relu(x)
        x = self.fc2(x)
        return x


def get_model():
    torch.manual_seed(0)  # fixed weights so the demo prints the same numbers on every machine
    return SimpleModel()
