"""A tiny Llama with real random weights, made locally, for benchmarks that need a model.

No weights can be downloaded on the machines kvring is tested on, and vLLM's
``load_format="dummy"`` is no use for checking KV: with dummy weights, a wrong or missing
KV load still yields the same tokens. With real random weights from transformers' own
initialisation (seeded), a wrong load changes tokens and logprobs; a right one matches.

The model: 2 layers, hidden 512, 8 attention heads, 2 KV heads (head dim 64), vocab 32000,
float32, 16384 positions. Its KV is 2 layers x 2 (K, V) x 2 heads x 64 x 4 bytes =
2 KiB per token (16 MiB for an 8k-token prompt).

    ensure_model(dir) -> dir     # creates it once (config.json + model.safetensors)

The directory is reused when its ``kvring-bench-model.json`` stamp matches GEOMETRY and SEED.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

__all__ = ["GEOMETRY", "SEED", "ensure_model", "kv_bytes_per_token"]

SEED = 1234
GEOMETRY = {
    "num_hidden_layers": 2,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 32000,
    "max_position_embeddings": 16384,
}
STAMP = "kvring-bench-model.json"


def kv_bytes_per_token(dtype_bytes: int = 4) -> int:
    g = GEOMETRY
    return g["num_hidden_layers"] * 2 * g["num_key_value_heads"] * g["head_dim"] * dtype_bytes


def ensure_model(path: str | os.PathLike) -> str:
    """Make the model in ``path`` unless a matching one is there; returns the path."""
    path = Path(path)
    want = {"geometry": GEOMETRY, "seed": SEED}
    stamp = path / STAMP
    if stamp.exists() and (path / "model.safetensors").exists():
        try:
            if json.loads(stamp.read_text()) == want:
                return str(path)
        except ValueError:
            pass

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        **GEOMETRY,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        torch_dtype="float32",
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / STAMP).write_text(json.dumps(want))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return str(path)


if __name__ == "__main__":
    import sys

    print(ensure_model(sys.argv[1] if len(sys.argv) > 1 else "build/vllm-bench/model"))
