"""A tiny Llama with real random weights, made locally, for benchmarks that need a model.

No weights can be downloaded on the machines kvring is tested on, and vLLM's
``load_format="dummy"`` is no use for checking KV: with dummy weights, a wrong or missing
KV load still yields the same tokens. With real random weights from transformers' own
initialisation (seeded), a wrong load changes tokens and logprobs; a right one matches.

The model: 2 layers, hidden 512, 8 attention heads, 2 KV heads (head dim 64), vocab 32000,
float32, 16384 positions. Its KV is 2 layers x 2 (K, V) x 2 heads x 64 x 4 bytes =
2 KiB per token (16 MiB for an 8k-token prompt).

    ensure_model(dir) -> dir     # creates it once (config.json + model.safetensors)
    ensure_tokenizer(dir) -> dir # adds a tokenizer (for `vllm serve`), weights untouched

The directory is reused when its ``kvring-bench-model.json`` stamp matches GEOMETRY and SEED.

The tokenizer. `vllm serve` and `vllm bench serve` need one and the model has none; none
can be downloaded. `ensure_tokenizer` builds a word-level one with the `tokenizers` library
(vLLM's own dependency): one word per id, ``<unk>`` ``<s>`` ``</s>`` at 0, 1, 2 (the
model's bos/eos ids) and after them the id in base 62 (``3`` ... ``8Ka``: at most three
characters, so a prompt has about 4 characters a token, as with real tokenizers; vLLM's
server refuses a prompt of more than 6 characters per token of max_model_len), split on
whitespace, no special tokens added to a prompt. Every id sequence decodes to words joined by spaces and encodes
back to the same ids, so a text prompt of N words is exactly N tokens, and vLLM's random
dataset (token ids -> text -> token ids) keeps its lengths. Saved as tokenizer.json,
tokenizer_config.json and special_tokens_map.json (PreTrainedTokenizerFast), stamped with
``kvring-bench-tokenizer.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

__all__ = ["GEOMETRY", "GEOMETRY_B", "SEED", "SPECIAL", "ensure_model", "ensure_tokenizer", "kv_bytes_per_token", "word"]

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
# A second model for one kvringd serving two (vllm-bench --serve --two-models): another
# geometry (4 layers, head dim 32) with the same KV bytes a token, so its block lane fills
# the same L1 slot; its own weights, so its own namespace.
GEOMETRY_B = dict(GEOMETRY, num_hidden_layers=4, head_dim=32)
STAMP = "kvring-bench-model.json"
TOKENIZER_STAMP = "kvring-bench-tokenizer.json"
SPECIAL = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: the config's bos_token_id 1, eos_token_id 2


def kv_bytes_per_token(dtype_bytes: int = 4, geometry: dict[str, int] | None = None) -> int:
    g = geometry or GEOMETRY
    return g["num_hidden_layers"] * 2 * g["num_key_value_heads"] * g["head_dim"] * dtype_bytes


def ensure_model(path: str | os.PathLike, geometry: dict[str, int] | None = None) -> str:
    """Make the model (GEOMETRY unless another is given) in ``path`` unless a matching one is
    there; returns the path."""
    path = Path(path)
    geometry = geometry or GEOMETRY
    want = {"geometry": geometry, "seed": SEED}
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
        **geometry,
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


_B62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def word(token_id: int) -> str:
    """The tokenizer's word for an id (special ids give their special token)."""
    if token_id < len(SPECIAL):
        return SPECIAL[token_id]
    out = ""
    while True:
        token_id, r = divmod(token_id, len(_B62))
        out = _B62[r] + out
        if not token_id:
            return out


def ensure_tokenizer(path: str | os.PathLike) -> str:
    """Add the word-level tokenizer to the model directory unless a matching one is there."""
    path = Path(path)
    want = {"kind": "wordlevel-base62", "vocab_size": GEOMETRY["vocab_size"], "special": list(SPECIAL)}
    stamp = path / TOKENIZER_STAMP
    if stamp.exists() and (path / "tokenizer.json").exists():
        try:
            if json.loads(stamp.read_text()) == want:
                return str(path)
        except ValueError:
            pass

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {word(i): i for i in range(GEOMETRY["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by one space
    tok.add_special_tokens(list(SPECIAL))
    tok.save(str(path / "tokenizer.json"))
    special = {"unk_token": SPECIAL[0], "bos_token": SPECIAL[1], "eos_token": SPECIAL[2]}
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": GEOMETRY["max_position_embeddings"],
                "clean_up_tokenization_spaces": False,
                "add_bos_token": False,
                "add_eos_token": False,
                **special,
            },
            indent=1,
        )
    )
    stamp.write_text(json.dumps(want))
    return str(path)


if __name__ == "__main__":
    import sys

    d = ensure_model(sys.argv[1] if len(sys.argv) > 1 else "build/vllm-bench/model")
    print(ensure_tokenizer(d))
