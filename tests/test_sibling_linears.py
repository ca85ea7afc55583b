"""Sibling linears stacked into one GEMM (aotc/export/sibling_linears.py): the model answers as
before, the right layers are stacked, and the stacked weights split back into the model's own."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from aotc.export.sibling_linears import PREFIX, StackedMember, fuse_sibling_linears, unstacked


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def probe(model) -> None:
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 2, dtype=torch.long))


def test_a_stacked_model_answers_as_the_model_as_written():
    model, original = llama(), llama()
    ids = torch.tensor([[3, 9, 27, 5, 11], [7, 7, 1, 60, 2]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])

    assert fuse_sibling_linears(model, lambda: probe(model)) == 4  # 2 layers x (q/k/v, gate/up)
    stacks = sorted(n for n, _ in model.named_modules() if n.rpartition(".")[2].startswith(PREFIX))
    assert stacks == [
        "model.layers.0.mlp.stacked__gate_proj__up_proj",
        "model.layers.0.self_attn.stacked__q_proj__k_proj__v_proj",
        "model.layers.1.mlp.stacked__gate_proj__up_proj",
        "model.layers.1.self_attn.stacked__q_proj__k_proj__v_proj",
    ]
    # each weight is held once: the members hold none, and the tied head is left alone
    assert isinstance(model.model.layers[0].self_attn.q_proj, StackedMember)
    assert not list(model.model.layers[0].self_attn.q_proj.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        expected = original(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_members_called_out_of_order_or_on_other_inputs_answer_for_themselves():
    class Siblings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 3)
            self.b = torch.nn.Linear(4, 5)

        def forward(self, x):
            return self.a(x), self.b(x)

    torch.manual_seed(0)
    model = Siblings()
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 5)
    a.load_state_dict(model.a.state_dict())
    b.load_state_dict(model.b.state_dict())
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    assert fuse_sibling_linears(model, lambda: model(x)) == 1
    with torch.no_grad():
        torch.testing.assert_close(model.b(y), b(y))  # b first, alone
        torch.testing.assert_close(model.a(x), a(x))  # a on another input
        torch.testing.assert_close(model.b(x), b(x))  # the slice a's product left
        torch.testing.assert_close(model.a(x), a(x))  # a again: its slice was taken, recomputed


def test_a_linear_called_twice_is_not_stacked():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(self.a(x)) + self.b(x)

    model = Twice()
    assert fuse_sibling_linears(model, lambda: model(torch.randn(1, 4))) == 0


def test_stacked_weights_split_back_into_the_models_own():
    model, original = llama(), llama()
    fuse_sibling_linears(model, lambda: probe(model))
    own = original.state_dict()
    weights = {f"model.{name}": t for name, t in model.state_dict().items()}  # a wrapper's names
    split = unstacked(weights, lambda name: own[name.removeprefix("model.")].shape[0])
    assert {n.removeprefix("model.") for n in split} == set(own)
    for name, tensor in split.items():
        assert torch.equal(tensor, own[name.removeprefix("model.")]), name
