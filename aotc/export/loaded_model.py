"""A model as aotc loaded it, from a model file (loading.py) or a model folder (model_folder.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoadedModel:
    module: object  # torch.nn.Module, in eval mode
    description: str  # "examples/mlp.py:SimpleModel"
    source_files: tuple  # the user's files, to point errors at
    example_inputs: object = None  # the file's example_inputs() function, if any
    notes: tuple = ()  # what the export tells the user of how the model was loaded
