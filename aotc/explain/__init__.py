"""`aotc explain`: why a model does or does not export (TorchDynamo graph breaks, torch.export problems)."""
