"""The connector's default model namespace (kvring/vllm/namespace.py), without engines.

Checkpoints made here (small safetensors and torch zip files) and the suite's tiny model:

- the same files give the same namespace (again, after the cache is dropped, and for a
  copy under the same directory name elsewhere: the path is not in the digest);
- different weights of one geometry (two seeds: same header, same sizes) differ; so does
  one byte changed at the middle of the data section, one byte at the middle of a tensor,
  one small tensor retrained; config.json changed or an index json added; and each of
  dtype, quantization, KV cache dtype, block size, layout, hf_overrides;
- `full` sees a byte `sampled` does not read (the documented limit of sampling);
- torch zip checkpoints (*.bin): a tensor changed -> another namespace (CRC-32s);
- a directory that does not exist or holds no weights: a name-only namespace (kind
  "name", the reason said, the path and revision in the digest), never a fingerprint;
- a hub id is found in a Hugging Face cache (download_dir) without network;
- `model_ns` wins (derive with a vllm_config-shaped object); the namespace is at most 63
  printable ASCII bytes whatever the name; weights_fingerprint is checked by config.parse;
- the tiny model's fingerprint time is logged (the start-up cost on every engine).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import kvtest as kt
import torch
from kvtest import check
from safetensors.torch import save_file

from kvring.vllm import config as kcfg
from kvring.vllm import namespace as kns

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2, "torch_dtype": "float32"}


def make_ckpt(d: Path, seed: int, *, name: str = "model.safetensors") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "embed.weight": torch.randn(2000, 256, generator=g),  # 2 MB
        "layers.0.norm.weight": torch.randn(256, generator=g),  # 1 KiB: read whole
        "layers.0.w1.weight": torch.randn(512, 256, generator=g),
        "layers.1.w2.weight": torch.randn(256, 512, generator=g),
        "lm_head.weight": torch.randn(2000, 256, generator=g),
    }
    save_file(tensors, str(d / name))
    (d / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return d


def model(d: Path | str, **kw) -> kns.EngineModel:
    base = dict(model=str(d), dtype="float32", kv_cache_dtype="auto", block_size=32, layout="cpu/LBHNC")
    base.update(kw)
    return kns.EngineModel(**base)


def ns(d: Path | str, mode: str = "sampled", **kw) -> str:
    kns._cache.clear()  # every call reads the files again
    return kns.namespace_for(model(d, **kw), mode).ns


def header(p: Path) -> bytes:
    with open(p, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return f.read(n)


def tensor_range(p: Path, name: str) -> tuple[int, int]:
    h = json.loads(header(p))
    start = 8 + len(header(p))
    b, e = h[name]["data_offsets"]
    return start + b, start + e


def flip(p: Path, off: int) -> None:
    with open(p, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x5A]))


def test_same_and_different(d: Path) -> None:
    a = make_ckpt(d / "a" / "tiny", 1)
    ns_a = ns(a)
    check(ns_a == ns(a), "the same files gave two namespaces")
    check(ns_a.startswith("tiny@") and len(ns_a) == len("tiny@") + kns.DIGEST_HEX, f"namespace {ns_a!r}")
    fp = kns.weights_fingerprint(a)
    check(fp.kind == "sampled" and fp.files == 1, f"fingerprint {fp}")
    check(fp.bytes_read < fp.weights_bytes, f"sampled read {fp.bytes_read} of {fp.weights_bytes} bytes")

    copy = d / "copy" / "tiny"
    shutil.copytree(a, copy)
    check(ns(copy) == ns_a, f"a copy of the same files elsewhere: {ns(copy)!r} != {ns_a!r}")
    renamed = d / "copy" / "tiny-renamed"
    shutil.copytree(a, renamed)
    check(ns(renamed).split("@")[1] == ns_a.split("@")[1], "a renamed copy: another digest")
    check(ns(renamed) != ns_a, "a renamed copy: the label is the directory's name")

    b = make_ckpt(d / "b" / "tiny", 2)
    check(header(a / "model.safetensors") == header(b / "model.safetensors"), "two seeds: different headers")
    check(
        (a / "model.safetensors").stat().st_size == (b / "model.safetensors").stat().st_size, "two seeds: sizes differ"
    )
    check(ns(b) != ns_a, f"other weights, same geometry, same namespace {ns_a!r}")
    check(ns(b, "full") != ns(a, "full"), "full: other weights, same namespace")
    check(ns(a, "full") != ns_a, "sampled and full give one namespace (they hash different things)")
    kt.log(f"same files -> {ns_a}; other seed -> {ns(b)}")


def test_one_change(d: Path) -> None:
    base = make_ckpt(d / "base" / "m", 3)
    ns0, full0 = ns(base), ns(base, "full")
    st = base / "model.safetensors"
    start, size = 8 + len(header(st)), st.stat().st_size

    def variant(tag: str, edit) -> Path:
        v = d / tag / "m"
        shutil.copytree(base, v)
        edit(v)
        return v

    cases = {
        "a byte at the middle of the data section": variant(
            "mid", lambda v: flip(v / "model.safetensors", start + (size - start) // 2)
        ),
        "a byte at the middle of a tensor": variant(
            "tmid", lambda v: flip(v / "model.safetensors", sum(tensor_range(st, "layers.1.w2.weight")) // 2)
        ),
        "a small tensor retrained": variant(
            "norm",
            lambda v: [flip(v / "model.safetensors", o) for o in range(*tensor_range(st, "layers.0.norm.weight"))],
        ),
        "config.json changed": variant(
            "cfg", lambda v: (v / "config.json").write_text(json.dumps({**CONFIG, "rms_norm_eps": 1e-6}, indent=2))
        ),
        "an index json added": variant(
            "idx", lambda v: (v / "model.safetensors.index.json").write_text('{"weight_map": {}}')
        ),
    }
    for what, v in cases.items():
        check(ns(v) != ns0, f"{what}: the same (sampled) namespace {ns0!r}")
        check(ns(v, "full") != full0, f"{what}: the same (full) namespace")

    # a byte sampling does not read: one outside every spread read and tensor middle
    n = size - start
    read = [(start + i * (n - kns.SAMPLE) // (kns.SPREAD_READS - 1), kns.SAMPLE) for i in range(kns.SPREAD_READS)]
    for name in json.loads(header(st)):
        if name != "__metadata__":
            tb, te = tensor_range(st, name)
            k = min(kns.SAMPLE, te - tb)
            read.append((tb + (te - tb - k) // 2, k))
    off = next(o for o in range(start, size, 997) if all(not (r <= o < r + k) for r, k in read))
    v = variant("unsampled", lambda v: flip(v / "model.safetensors", off))
    check(ns(v) == ns0, "sampled saw a byte it should not read (the test's offset is wrong)")
    check(ns(v, "full") != full0, "full missed a changed byte")

    for k, val in (
        ("dtype", "bfloat16"),
        ("quantization", "fp8"),
        ("kv_cache_dtype", "fp8_e4m3"),
        ("block_size", 16),
        ("layout", "cuda/LBHNC"),
        ("hf_overrides", '{"rope_theta": 1}'),
        ("load_format", "dummy"),
    ):
        check(ns(base, **{k: val}) != ns0, f"{k}={val!r}: the same namespace")
    check(ns(base, revision="v2") == ns0, "a revision changed a fingerprinted namespace (the content decides)")
    check(ns(base, load_format="safetensors") == ns0, "load_format safetensors changed the namespace")


def test_torch_zip(d: Path) -> None:
    a = d / "pt-a" / "m"
    a.mkdir(parents=True)
    g = torch.Generator().manual_seed(5)
    sd = {"w": torch.randn(1024, 256, generator=g), "v": torch.randn(300, generator=g)}
    torch.save(sd, a / "pytorch_model.bin")
    (a / "config.json").write_text(json.dumps(CONFIG))
    b = d / "pt-b" / "m"
    b.mkdir(parents=True)
    sd["w"][700, 3] += 1.0  # one element, far from any sample: the zip CRC-32 sees it
    torch.save(sd, b / "pytorch_model.bin")
    (b / "config.json").write_text(json.dumps(CONFIG))
    check((a / "pytorch_model.bin").stat().st_size == (b / "pytorch_model.bin").stat().st_size, "zip sizes differ")
    check(ns(a) != ns(b), "torch zip checkpoints with one element changed: the same namespace")
    c = d / "pt-c" / "m"
    shutil.copytree(a, c)
    check(ns(a) == ns(c), "a copy of a torch checkpoint: another namespace")
    # a file that is neither safetensors nor zip: plain spread
    p = d / "plain" / "m"
    p.mkdir(parents=True)
    (p / "weights.pt").write_bytes(os.urandom(3 << 20))
    fp = kns.weights_fingerprint(p)
    check(fp.files == 1 and fp.bytes_read <= kns.PLAIN_READS * kns.SAMPLE + 4096, f"plain file: {fp}")


def test_no_weights(d: Path) -> None:
    missing = d / "nowhere" / "tiny"
    n = kns.namespace_for(model(missing))
    check(n.fingerprint is None and n.weights == "name", f"a missing directory was fingerprinted: {n}")
    check("does not exist" in n.why_no_fingerprint or "not a local path" in n.why_no_fingerprint, n.why_no_fingerprint)
    check("NOT fingerprinted" in n.describe(), n.describe())
    other = kns.namespace_for(model(d / "elsewhere" / "tiny"))
    check(other.ns != n.ns, "name-only: two paths of one name share a namespace")
    check(kns.namespace_for(model(missing, revision="r2")).ns != n.ns, "name-only: the revision is not in it")
    empty = d / "empty" / "tiny"
    empty.mkdir(parents=True)
    (empty / "config.json").write_text("{}")
    e = kns.namespace_for(model(empty))
    check(e.fingerprint is None and "no weights files" in e.why_no_fingerprint, f"no weights: {e}")
    fp_dir = make_ckpt(d / "fp" / "tiny", 1)
    check(kns.namespace_for(model(fp_dir)).ns != kns.namespace_for(model(d / "gone" / "tiny")).ns, "name == fp")
    dummy = kns.namespace_for(model(fp_dir, load_format="dummy"))
    check(dummy.fingerprint is None and "dummy" in dummy.why_no_fingerprint, f"load_format dummy: {dummy}")


def test_hub_cache(d: Path) -> None:
    cache = d / "hf"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = cache / "models--org--tiny-hub" / "snapshots" / commit
    make_ckpt(snap, 1)
    (cache / "models--org--tiny-hub" / "refs").mkdir(parents=True)
    (cache / "models--org--tiny-hub" / "refs" / "main").write_text(commit)
    got = kns.resolve_model_dir("org/tiny-hub", None, str(cache))
    check(got is not None and got.resolve() == snap.resolve(), f"hub id resolved to {got}, want {snap}")
    check(kns.resolve_model_dir("org/not-there", None, str(cache)) is None, "a hub id not in the cache resolved")
    n = kns.namespace_for(model("org/tiny-hub", download_dir=str(cache)))
    check(n.fingerprint is not None and n.ns.startswith("tiny-hub@"), f"hub id: {n}")
    local = make_ckpt(d / "local" / "tiny-hub", 1)
    check(ns(local) == n.ns, "the hub snapshot and a local copy of its files (same name) differ")
    check(kns.model_label(str(snap)) == "tiny-hub", f"label of a snapshot path: {kns.model_label(str(snap))}")


def test_override_and_shape(d: Path) -> None:
    ck = make_ckpt(d / "ov" / "tiny", 1)
    vc = SimpleNamespace(
        model_config=SimpleNamespace(
            model=str(ck), revision=None, dtype=torch.float32, quantization=None, hf_overrides={}, model_weights=""
        ),
        cache_config=SimpleNamespace(block_size=32, cache_dtype="auto", kv_cache_layout="LBHNC"),
        load_config=SimpleNamespace(load_format="auto", download_dir=None),
        device_config=SimpleNamespace(device_type="cpu"),
    )
    m = kns.EngineModel.from_vllm_config(vc)
    check(
        m.dtype == "float32" and m.layout == "cpu/LBHNC" and m.block_size == 32 and m.quantization is None,
        f"from_vllm_config: {m}",
    )
    derived = kns.derive(vc, kcfg.parse({}))
    check(not derived.explicit and derived.ns == ns(ck, layout="cpu/LBHNC"), f"derive: {derived.ns}")
    for part in ("float32", "block size 32", "cpu/LBHNC", "weights sampled", "kv cache dtype auto", "quantization -"):
        check(part in derived.describe(), f"the log line lacks {part!r}: {derived.describe()}")
    over = kns.derive(vc, kcfg.parse({"model_ns": "shared-on-purpose"}))
    check(over.explicit and over.ns == "shared-on-purpose", f"model_ns did not win: {over}")
    full = kns.derive(vc, kcfg.parse({"weights_fingerprint": "full"}))
    check(full.fingerprint is not None and full.fingerprint.kind == "full", f"full: {full}")
    long = d / ("x" * 80 + " ünïcode name") / "tiny"
    n = kns.namespace_for(model(long))
    check(len(n.ns.encode()) <= 63 and n.ns.isascii() and n.ns.isprintable(), f"long name: {n.ns!r}")
    kcfg.parse({"model_ns": n.ns})  # the connector's own check accepts it
    try:
        kcfg.parse({"weights_fingerprint": "off"})
    except kcfg.ConfigError as e:
        check("model_ns" in str(e), f"refusal of 'off' does not point at model_ns: {e}")
    else:
        raise kt.TestFailure("weights_fingerprint 'off' accepted")


def test_tiny_model_cost() -> None:
    d = kt.tiny_model()
    kns._cache.clear()
    fp = kns.weights_fingerprint(d)
    full = kns.weights_fingerprint(d, "full")
    n = kns.namespace_for(model(d))
    kt.log(
        f"tiny model ({fp.weights_bytes / 2**20:.0f} MiB): sampled {fp.seconds * 1000:.1f} ms "
        f"({fp.bytes_read / 1024:.0f} KiB read), full {full.seconds * 1000:.0f} ms; namespace {n.ns}"
    )


def main(d: Path) -> None:
    test_same_and_different(d)
    test_one_change(d)
    test_torch_zip(d)
    test_no_weights(d)
    test_hub_cache(d)
    test_override_and_shape(d)
    test_tiny_model_cost()


if __name__ == "__main__":
    kt.run(main, needs_vllm=True)
