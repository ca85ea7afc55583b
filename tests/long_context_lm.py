"""A tiny Llama (LlamaForCausalLM, random weights) with room for 1,024 positions, where the zoo's
models hold 64: the structured-output tests' model (tests/test_serve_structured.py), whose prompts
carry tool descriptions and whose answers are whole JSON texts."""

from transformers import LlamaConfig, LlamaForCausalLM


def get_model():
    config = LlamaConfig(
        vocab_size=300,  # json_tokenizer.SIZE
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        use_cache=False,
    )
    return LlamaForCausalLM(config).eval()
