"""Dynamic batching of requests along the package's batch dim: which dim that is, how many rows a
batch may hold, and how requests are joined into one call and its outputs split back.

A package batches when one named dim is the first axis of every input and of every output, and it
carries no state (state would pass from one request's rows to another's). Requests whose other dims
differ (two sequence lengths) run in separate calls: they cannot share a tensor.
No padding: a batch runs at the size it has (the specialized member of that size, if the package
has one). Padding rows up to a specialized size would change the answers of models that mix rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from aotc_runtime import Signature


def batch_dim(signature: Signature) -> str | None:
    """The dim requests are joined along, or None when the package cannot batch them."""
    if signature.state or not signature.inputs or not signature.outputs:
        return None
    first = signature.inputs[0].shape[:1]
    if not first or not isinstance(first[0], str):
        return None
    name = first[0]
    specs = list(signature.inputs) + list(signature.outputs)
    if all(spec.shape[:1] == (name,) for spec in specs):
        return name
    return None


def batch_limit(signature: Signature, dim: str, max_batch_size: int) -> int:
    """The most rows one call may take: the server's limit within the package's range of `dim`."""
    return max(1, min(max_batch_size, int(signature.dims[dim]["max"])))


def rows(tensors: list[torch.Tensor]) -> int:
    """A request's rows: the batch dim is the first axis of every input."""
    return int(tensors[0].shape[0])


def group_key(tensors: list[torch.Tensor]) -> tuple:
    """Requests with the same key can be joined: every axis but the first, and the dtypes, agree."""
    return tuple((tuple(t.shape[1:]), t.dtype) for t in tensors)


def join(requests: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """One call's inputs from several requests (of one group_key), rows in request order."""
    import torch

    if len(requests) == 1:
        return requests[0]
    return [torch.cat(column) for column in zip(*requests)]


def split(outputs: list[torch.Tensor], sizes: list[int]) -> list[list[torch.Tensor]]:
    """A joined call's outputs back into each request's rows (the inverse of join)."""
    if len(sizes) == 1:
        return [outputs]
    parts = [output.split(sizes) for output in outputs]
    return [[part[index] for part in parts] for index in range(len(sizes))]


def groups(requests: list[list[torch.Tensor]]) -> list[list[int]]:
    """Indexes of the requests that can share a call, first-come order within each group."""
    by_key: dict[tuple, list[int]] = {}
    for index, tensors in enumerate(requests):
        by_key.setdefault(group_key(tensors), []).append(index)
    return list(by_key.values())
