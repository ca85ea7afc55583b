"""Which buffers a forward writes, as the export's eager run sees them (aotc/export/trace.py's
buffer_writes): the export lifts exactly these out as the package's state, without a first export
to functionalize."""

from __future__ import annotations

import torch

from aotc.export.trace import buffer_writes, buffers_restored


class Writes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))
        self.register_buffer("cache", torch.zeros(4, 3))
        self.register_buffer("grown", torch.zeros(2))
        self.register_buffer("kept", torch.ones(3))

    def forward(self, x):
        self.count += 1  # in place
        self.cache[1].copy_(x)  # through a view
        self.grown = torch.cat([self.grown, x[:1]])  # rebound to another tensor
        return x * self.kept  # read only


def test_in_place_writes_writes_through_a_view_and_rebinding_are_seen_and_reads_are_not():
    model = Writes()
    with torch.no_grad(), buffer_writes(model) as written:
        model(torch.ones(3))
    assert written == ["cache", "count", "grown"]


def test_buffers_without_a_version_counter_say_they_cannot_tell():
    with torch.inference_mode():
        model = Writes()
    with torch.inference_mode(), buffer_writes(model) as written:
        model(torch.ones(3))
    assert written == [None]


class WritesThroughData(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("hidden", torch.zeros(3))

    def forward(self, x):
        self.hidden.data.copy_(x)  # `.data` has a version counter of its own: the buffer's stays
        return x + 1


def test_a_write_the_version_counter_misses_says_it_cannot_tell():
    model = WritesThroughData()
    with torch.no_grad(), buffers_restored(model) as saved, buffer_writes(model, saved) as written:
        model(torch.ones(3))
    assert written == [None]
    assert torch.equal(model.hidden, torch.zeros(3)), "restored after"
