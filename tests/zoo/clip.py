"""CLIP two-tower model (CLIPModel), tiny random config: text tower (vocab 512, 2 layers, 32 wide),
vision tower (32x32 images, 8x8 patches, 2 layers, 32 wide), projection 32.

Inputs: input_ids (B, 16): BOS 510, text, EOS 511 (the text tower pools at the first EOS), then
padding 1; attention_mask (row 1 padded after its EOS); pixel_values (B, 3, 32, 32).
Returns CLIPOutput: logits_per_image (B, B), logits_per_text (B, B), text_embeds (B, 32),
image_embeds (B, 32), text_model_output and vision_model_output (last_hidden_state, pooler_output each).
"""

import torch
from transformers import CLIPConfig, CLIPModel

VOCAB = 512
PAD, BOS, EOS = 1, VOCAB - 2, VOCAB - 1


def get_model():
    return CLIPModel(
        CLIPConfig(
            text_config=dict(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                max_position_embeddings=64,
                projection_dim=32,
                pad_token_id=PAD,
                bos_token_id=BOS,
                eos_token_id=EOS,
            ),
            vision_config=dict(
                image_size=32,
                patch_size=8,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                projection_dim=32,
            ),
            projection_dim=32,
        )
    )


def example_inputs():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, BOS, (2, 16), generator=g)
    input_ids[:, 0] = BOS
    input_ids[0, 15] = EOS
    input_ids[1, 11] = EOS
    input_ids[1, 12:] = PAD
    attention_mask = torch.ones(2, 16, dtype=torch.int64)
    attention_mask[1, 12:] = 0
    pixel_values = torch.randn(2, 3, 32, 32, generator=g)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "pixel_values": pixel_values}
