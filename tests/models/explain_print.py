"""A print() in forward: TorchDynamo breaks the graph around it."""

import torch


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        print("activation mean", y.mean())
        return torch.relu(y)
