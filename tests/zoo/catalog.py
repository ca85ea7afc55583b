"""The model zoo: small transformers models (tests/zoo/*.py) and realistic-size GPU models (tests/zoo/gpu/*.py).

Each model file defines get_model() (the model as a user builds it, random init from a small config) and
example_inputs() (a dict of keyword inputs, in the order the model is called with them).

dims are aotc --dim flags with the inputs they apply to: NAME=MIN:MAX[:EXAMPLE]@INPUT:AXIS[,INPUT:AXIS...];
the example size is the size in example_inputs(). Empty dims = static shapes.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ZooModel:
    name: str  # "bert"
    file: str  # "bert.py" (relative to tests/zoo)
    family: str  # "encoder", "decoder-lm", "encoder-decoder", "classification", "vision", "audio", "two-tower"
    dims: tuple = ()  # dynamic dims as aotc --dim flags (see above); empty = static shapes
    atol: float = 1e-4  # tolerance vs eager if a model needs looser (say why in a comment)
    source: str = "transformers"  # "transformers", "timm", "torchvision"
    expected_failure: str = ""  # why the model cannot be exported, if it cannot ("" = it can)


def _dims(batch: str, seq: str, inputs: str, batch_inputs: str = "") -> tuple:
    """B and S over the same inputs (axis 0 and 1)."""
    b = ",".join(f"{i}:0" for i in (batch_inputs or inputs).split(","))
    s = ",".join(f"{i}:1" for i in inputs.split(","))
    return (f"B={batch}@{b}", f"S={seq}@{s}")


_BERT = "input_ids,attention_mask,token_type_ids"
_LM = "input_ids,attention_mask"

ZOO = (
    # encoders
    ZooModel("bert", "bert.py", "encoder", _dims("1:8", "1:64", _BERT)),
    # max_position_embeddings 66 = 64 + pad offset
    ZooModel("roberta", "roberta.py", "encoder", _dims("1:8", "1:64", _LM)),
    ZooModel("mobilebert", "mobilebert.py", "encoder"),
    # classification heads
    ZooModel("bert_seqcls", "bert_seqcls.py", "classification", _dims("1:8", "1:64", _BERT)),
    ZooModel(
        "distilbert_tokcls", "distilbert_tokcls.py", "classification", _dims("1:8", "1:64", _LM)
    ),
    # decoder-only LMs (use_cache=False)
    ZooModel("gpt2", "gpt2.py", "decoder-lm", _dims("1:8", "1:64", _LM)),
    ZooModel("llama", "llama.py", "decoder-lm", _dims("1:8", "1:64", _LM)),
    # GQA models (qwen2, mistral): no dynamic sequence dim, since torch 2.11's export cannot prove the guard
    # min(16*S, 32*S) == 16*S that repeat_kv's expand+reshape produces (torch 2.13 can); llama (MHA) has one.
    ZooModel("qwen2", "qwen2.py", "decoder-lm", ("B=1:8@input_ids:0,attention_mask:0",)),
    ZooModel("mistral", "mistral.py", "decoder-lm"),
    # mixture of experts: exported with transformers' "batched_mm" experts (aotc/export/trace.py)
    ZooModel("qwen2_moe", "qwen2_moe.py", "decoder-lm"),
    # encoder-decoders: encoder length S and decoder length T are separate dims
    ZooModel(
        "t5",
        "t5.py",
        "encoder-decoder",
        (
            "B=1:8@input_ids:0,attention_mask:0,decoder_input_ids:0",
            "S=1:64@input_ids:1,attention_mask:1",
            "T=1:64@decoder_input_ids:1",
        ),
    ),
    ZooModel(
        "bart",
        "bart.py",
        "encoder-decoder",
        (
            "B=1:8@input_ids:0,attention_mask:0,decoder_input_ids:0",
            "S=1:64@input_ids:1,attention_mask:1",
            "T=1:64@decoder_input_ids:1",
        ),
    ),
    # vision
    ZooModel("vit", "vit.py", "vision", ("B=1:16@pixel_values:0",)),
    ZooModel("convnext", "convnext.py", "vision", ("B=1:16@pixel_values:0",)),
    ZooModel("swin", "swin.py", "vision", ("B=1:16@pixel_values:0",)),
    ZooModel("resnet", "resnet.py", "vision"),
    # audio
    ZooModel("whisper_encoder", "whisper_encoder.py", "audio", ("B=1:8@input_features:0",)),
    ZooModel(
        "whisper",
        "whisper.py",
        "audio",
        ("B=1:8@input_features:0,decoder_input_ids:0", "T=1:64@decoder_input_ids:1"),
    ),
    ZooModel("wav2vec2", "wav2vec2.py", "audio", ("B=1:8@input_values:0",)),
    # two towers
    ZooModel(
        "clip",
        "clip.py",
        "two-tower",
        (
            "B=1:8@input_ids:0,attention_mask:0",
            "S=2:64@input_ids:1,attention_mask:1",
            "I=1:8@pixel_values:0",
        ),
    ),
)

# Realistic sizes, for the GPU machine (torch 2.11, transformers, timm, torchvision). Static shapes.
# atol 1e-3 (unmeasured guess): deep fp32 nets on CUDA, where the compiled kernels (and TF32 if enabled)
# accumulate in another order than eager's cuBLAS/cuDNN calls.
_GPU_ATOL = 1e-3

GPU_ZOO = (
    ZooModel("gpt2_124m", "gpu/gpt2_124m.py", "decoder-lm", atol=_GPU_ATOL),
    ZooModel("bert_base", "gpu/bert_base.py", "encoder", atol=_GPU_ATOL),
    ZooModel("distilbert_qa", "gpu/distilbert_qa.py", "encoder", atol=_GPU_ATOL),
    ZooModel("llama_120m", "gpu/llama_120m.py", "decoder-lm", atol=_GPU_ATOL),
    ZooModel("convnext_tiny", "gpu/convnext_tiny.py", "vision", atol=_GPU_ATOL, source="timm"),
    ZooModel(
        "efficientnet_b0", "gpu/efficientnet_b0.py", "vision", atol=_GPU_ATOL, source="torchvision"
    ),
    ZooModel("swin_t", "gpu/swin_t.py", "vision", atol=_GPU_ATOL, source="torchvision"),
    ZooModel(
        "regnet_y_400mf", "gpu/regnet_y_400mf.py", "vision", atol=_GPU_ATOL, source="torchvision"
    ),
    ZooModel("resnet50", "gpu/resnet50.py", "vision", atol=_GPU_ATOL, source="torchvision"),
    ZooModel("vit_b_16", "gpu/vit_b_16.py", "vision", atol=_GPU_ATOL, source="torchvision"),
    # the bf16 table's five transformers models (with distilbert_qa and llama_120m above)
    ZooModel(
        "roberta_base_seqcls",
        "gpu/roberta_base_seqcls.py",
        "classification",
        _dims("1:16", "8:510", _LM),  # the longest roberta-base runs (aotc export measured it)
        atol=_GPU_ATOL,
    ),
    ZooModel(
        "vit_base_hf", "gpu/vit_base_hf.py", "vision", ("B=1:16@pixel_values:0",), atol=_GPU_ATOL
    ),
    ZooModel("t5_small", "gpu/t5_small.py", "encoder-decoder", atol=_GPU_ATOL),
)
