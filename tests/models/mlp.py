"""The seeds' MLP 128 -> 256 -> 10 (batch 32; also used with a dynamic batch)."""
import torch
import torch.nn as nn


class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(128, 256)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def get_model():
    torch.manual_seed(0)
    return SimpleModel()
