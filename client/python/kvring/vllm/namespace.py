"""The connector's default model namespace: what the engine runs, weights included.

Engines whose namespaces are equal share kvring blocks, so the namespace must change
whenever the KV a prompt produces can change: two models of one geometry with different
weights (a base model and its fine-tune, two random inits) must not share. The default
namespace is therefore derived from

- the **weights**: a fingerprint of the checkpoint directory (`weights_fingerprint`):
  config.json (and the other config files listed in `CONFIG_FILES`), the checkpoint's
  index json, and per weights file its name, size, header and a content sample;
- the model's **dtype** and **quantization**, the **KV cache dtype**, the **block size**,
  the **KV layout** (device type and vLLM's resolved layout), and vLLM's ``hf_overrides``
  and a ``load_format`` of ``dummy`` when set — all taken from ``vllm_config``.

It reads ``<label>@<digest>``: ``label`` is the model's short name (the directory's or the
hub id's last component, sanitised to ``[A-Za-z0-9._-]``, at most 42 bytes), ``digest`` 20
hex digits of blake2b over everything above, so it is at most 63 printable bytes
(kvring's KVR_MODEL_NS_MAX is 64 with the NUL). It is a pure function of ``vllm_config``
and the files, so the scheduler and every worker of one engine compute the same string
(kvringd refuses an engine whose clients bring different namespaces).

With a weights fingerprint the model's *path* does not go into the digest (a copy of the
same files under the same directory name elsewhere shares); without one (the directory
cannot be found or read, or holds no weights files) the name and revision do, the
fingerprint kind is ``name``, and a warning says that engines of this name share blocks
whatever their weights. ``model_ns`` in kv_connector_extra_config overrides all of it.

Fingerprint kinds (``kv_connector_extra_config.weights_fingerprint``):

- ``sampled`` (default): per weights file its size and, for safetensors, the header (its
  JSON: every tensor's name, dtype, shape and offsets) plus a 4 KiB read from the middle
  of every tensor (at most 4096 tensors per file, evenly chosen) and 17 reads of 4 KiB
  evenly spaced over the data section (its first, middle and last 4 KiB among them); for
  zip checkpoints (torch's *.bin / *.pt) the zip directory (every entry's name, size and
  CRC-32 of its content) plus a read from the middle of every entry and the 17 spread
  reads; for other files (legacy pickles, GGUF) 256 evenly spaced reads of 4 KiB. A few
  MB read, whatever the model's size. A fine-tune changes every element of the tensors it
  trains, so a sample of each tensor sees it; a change of a few bytes elsewhere is seen by
  ``full`` only.
- ``full``: every byte of every weights file (the time of reading the checkpoint once:
  seconds per GB from disk).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from .config import ConnectorConfig

__all__ = [
    "FINGERPRINT_MODES",
    "EngineModel",
    "Fingerprint",
    "FingerprintError",
    "Namespace",
    "derive",
    "namespace_for",
    "resolve_model_dir",
    "weights_fingerprint",
]

log = logging.getLogger("vllm.kvring")

FINGERPRINT_MODES = ("sampled", "full")
NS_MAX = 63  # printable bytes (KVR_MODEL_NS_MAX 64 with the NUL)
DIGEST_HEX = 20  # 80 bits
LABEL_MAX = NS_MAX - 1 - DIGEST_HEX

# files whose content changes what the model computes (besides the weights)
CONFIG_FILES = ("config.json", "params.json", "quantize_config.json", "quant_config.json", "hf_quant_config.json")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
OTHER_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.gguf")

SAMPLE = 4096  # bytes per read
SPREAD_READS = 17  # evenly spaced reads over a structured file's data (the middle one at its midpoint)
PLAIN_READS = 256  # evenly spaced reads over a file we cannot parse
MAX_TENSOR_READS = 4096  # per file: one read per tensor / zip entry, at most this many
_SAFETENSORS_HEADER_MAX = 100 << 20  # the format's own limit
_FULL_CHUNK = 8 << 20


class FingerprintError(OSError):
    """The model directory cannot be fingerprinted (missing, unreadable, no weights)."""


@dataclass(frozen=True)
class Fingerprint:
    kind: str  # "sampled", "full"
    digest: str  # hex
    path: str  # the directory read
    files: int  # weights files
    weights_bytes: int  # their total size
    bytes_read: int  # bytes read to make it (headers and samples; everything for "full")
    seconds: float


@dataclass(frozen=True)
class EngineModel:
    """What of an engine's configuration goes into its namespace (`from_vllm_config`)."""

    model: str  # name or path, as vLLM was given it
    revision: str | None = None
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    block_size: int = 0
    layout: str = ""  # device type / vLLM's resolved KV cache layout
    load_format: str = "auto"
    hf_overrides: str = ""  # canonical JSON of vLLM's hf_overrides, "" when none
    download_dir: str | None = None

    @classmethod
    def from_vllm_config(cls, vllm_config: VllmConfig, kv_cache_config: Any = None) -> EngineModel:
        mc = vllm_config.model_config
        cc = vllm_config.cache_config
        lc = getattr(vllm_config, "load_config", None)
        lf = getattr(lc, "load_format", None) or "auto"
        dev = str(getattr(vllm_config.device_config, "device_type", "") or "cpu")
        # resolved by the engine core before the scheduler exists and sent to every
        # worker before its connector is made (vLLM's set_kv_cache_layout /
        # KVCacheConfig.kv_cache_layout), so both halves see the same name
        layout = getattr(cc, "kv_cache_layout", None) or getattr(kv_cache_config, "kv_cache_layout", None) or "auto"
        overrides = getattr(mc, "hf_overrides", None)
        if overrides and not callable(overrides):
            ov = json.dumps(overrides, sort_keys=True, default=str)
        elif overrides:
            ov = f"callable:{getattr(overrides, '__module__', '')}.{getattr(overrides, '__qualname__', '')}"
        else:
            ov = ""
        return cls(
            model=str(mc.model),
            revision=getattr(mc, "revision", None),
            dtype=_dtype_name(getattr(mc, "dtype", "auto")),
            quantization=(str(mc.quantization) if getattr(mc, "quantization", None) else None),
            kv_cache_dtype=str(getattr(cc, "cache_dtype", "auto") or "auto"),
            block_size=int(cc.block_size or 0),
            layout=f"{dev}/{layout}",
            load_format=str(getattr(lf, "value", lf)),
            hf_overrides=ov,
            download_dir=getattr(lc, "download_dir", None) if lc is not None else None,
        )


@dataclass(frozen=True)
class Namespace:
    ns: str  # what the connector attaches with
    explicit: bool  # model_ns was given in kv_connector_extra_config
    label: str = ""
    fingerprint: Fingerprint | None = None
    weights: str = ""  # "sampled:<hex>", "full:<hex>" or "name" (no fingerprint)
    why_no_fingerprint: str = ""
    model: EngineModel | None = None
    parts: dict[str, Any] = field(default_factory=dict)  # exactly what the digest covers

    def describe(self) -> str:
        """The start-up log line's body."""
        if self.explicit:
            return f"model namespace {self.ns!r} (model_ns in kv_connector_extra_config: shared on purpose)"
        m = self.model
        assert m is not None
        fp = self.fingerprint
        if fp is not None:
            w = (
                f"weights {fp.kind} {fp.digest[:16]} ({fp.files} files, {fp.weights_bytes} bytes, "
                f"{fp.bytes_read} read in {fp.seconds * 1000:.0f} ms)"
            )
        else:
            w = f"weights NOT fingerprinted ({self.why_no_fingerprint}): name-only"
        return (
            f"model namespace {self.ns!r} from model {m.model!r} revision {m.revision or '-'}, {w}, "
            f"dtype {m.dtype}, quantization {m.quantization or '-'}, kv cache dtype {m.kv_cache_dtype}, "
            f"block size {m.block_size}, layout {m.layout}"
            + (f", load_format {m.load_format}" if "load_format" in self.parts else "")
            + (", hf_overrides" if m.hf_overrides else "")
        )


def _dtype_name(d: Any) -> str:
    s = str(d)
    return s[6:] if s.startswith("torch.") else s


# ---- locating the checkpoint -----------------------------------------------------------------


def resolve_model_dir(model: str, revision: str | None = None, download_dir: str | None = None) -> Path | None:
    """The local directory (or single weights file) vLLM loads `model` from: the path
    itself, or a hub id's snapshot in the Hugging Face cache (never downloads)."""
    p = Path(model).expanduser()
    try:
        if p.exists():
            return p
    except OSError:  # EACCES on a parent: fingerprinting it fails the same way
        return p
    if model.startswith(("s3://", "gs://", "http://", "https://")) or os.path.isabs(model):
        return None
    try:
        import huggingface_hub as hf
    except ImportError:
        return None
    try:
        hit = hf.try_to_load_from_cache(model, "config.json", cache_dir=download_dir, revision=revision)
        if isinstance(hit, str) and os.path.isfile(hit):
            return Path(hit).parent
    except Exception:  # noqa: BLE001 - a malformed id, an odd cache: not found
        pass
    try:
        snap = hf.snapshot_download(model, revision=revision, cache_dir=download_dir, local_files_only=True)
        if isinstance(snap, str) and os.path.isdir(snap):
            return Path(snap)
    except Exception:  # noqa: BLE001
        pass
    return None


def model_label(model: str) -> str:
    """A short readable name: the directory's (or hub id's) last component, sanitised."""
    s = model.rstrip("/")
    parts = s.replace("\\", "/").split("/")
    name = parts[-1] if parts else s
    # a path inside the HF cache: .../models--org--name/snapshots/<commit>
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        name = parts[-3].split("--")[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"
    return name[:LABEL_MAX]


# ---- the fingerprint -------------------------------------------------------------------------


def _weights_files(d: Path) -> list[Path]:
    """The files vLLM would load weights from: *.safetensors when there are any (vLLM
    prefers them), else torch/GGUF files. Top level only (vLLM ignores original/)."""
    st = sorted(p for p in d.glob("*.safetensors") if p.is_file())
    if st:
        return st
    out: set[Path] = set()
    for pat in OTHER_WEIGHTS:
        out.update(p for p in d.glob(pat) if p.is_file() and not p.name.startswith("training_args"))
    return sorted(out)


class _Reader:
    def __init__(self, h: Any) -> None:
        self.h = h
        self.read = 0

    def pread(self, fd: int, n: int, off: int) -> bytes:
        b = os.pread(fd, n, off)
        self.read += len(b)
        return b


def _spread(r: _Reader, fd: int, start: int, end: int, reads: int) -> None:
    """`reads` reads of SAMPLE bytes evenly spaced over [start, end) (all of it when small)."""
    n = end - start
    if n <= 0:
        return
    if n <= reads * SAMPLE:
        off = start
        while off < end:
            r.h.update(r.pread(fd, min(_FULL_CHUNK, end - off), off))
            off += _FULL_CHUNK
        return
    for i in range(reads):
        off = start + (i * (n - SAMPLE)) // (reads - 1)
        r.h.update(struct.pack("<Q", off - start))
        r.h.update(r.pread(fd, SAMPLE, off))


def _middles(r: _Reader, fd: int, ranges: list[tuple[int, int]]) -> None:
    """One read of up to SAMPLE bytes from the middle of each range (at most MAX_TENSOR_READS
    of them, evenly chosen)."""
    if len(ranges) > MAX_TENSOR_READS:
        step = len(ranges) / MAX_TENSOR_READS
        ranges = [ranges[int(i * step)] for i in range(MAX_TENSOR_READS)]
    for b, e in ranges:
        n = min(SAMPLE, e - b)
        if n <= 0:
            continue
        off = b + (e - b - n) // 2
        r.h.update(r.pread(fd, n, off))


def _safetensors(r: _Reader, fd: int, size: int) -> bool:
    """Header + per-tensor middles + spread; False when the file is not safetensors."""
    if size < 8:
        return False
    (hlen,) = struct.unpack("<Q", r.pread(fd, 8, 0))
    if hlen == 0 or hlen > _SAFETENSORS_HEADER_MAX or 8 + hlen > size:
        return False
    header = r.pread(fd, hlen, 8)
    r.h.update(b"safetensors\0" + struct.pack("<Q", hlen) + header)
    start = 8 + hlen
    try:
        meta = json.loads(header)
        ranges = sorted(
            (start + int(v["data_offsets"][0]), start + int(v["data_offsets"][1]))
            for k, v in meta.items()
            if k != "__metadata__"
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        ranges = []
    _middles(r, fd, [(b, e) for b, e in ranges if start <= b <= e <= size])
    _spread(r, fd, start, size, SPREAD_READS)
    return True


def _zip(r: _Reader, fd: int, path: Path, size: int) -> bool:
    """torch's zip checkpoints: the directory (names, sizes, CRC-32s) + entry middles."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    r.h.update(b"zip\0")
    ranges = []
    for i in infos:
        r.h.update(f"{i.filename}\0{i.file_size}\0{i.CRC:08x}\0{i.compress_type}\n".encode())
        if i.compress_type == zipfile.ZIP_STORED and i.file_size:
            lh = r.pread(fd, 30, i.header_offset)
            if len(lh) == 30 and lh[:4] == b"PK\x03\x04":
                nlen, xlen = struct.unpack("<HH", lh[26:30])
                b = i.header_offset + 30 + nlen + xlen
                ranges.append((b, min(size, b + i.file_size)))
    _middles(r, fd, ranges)
    _spread(r, fd, 0, size, SPREAD_READS)
    return True


def _file(r: _Reader, path: Path, rel: str, mode: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        r.h.update(f"file\0{rel}\0{size}\0".encode())
        if mode == "full":
            off = 0
            while off < size:
                b = r.pread(fd, _FULL_CHUNK, off)
                if not b:
                    break
                r.h.update(b)
                off += len(b)
            return size
        if path.suffix == ".safetensors" and _safetensors(r, fd, size):
            return size
        if path.suffix in (".bin", ".pt", ".pth") and _zip(r, fd, path, size):
            return size
        r.h.update(b"plain\0")
        _spread(r, fd, 0, size, PLAIN_READS)
        return size
    finally:
        os.close(fd)


_cache: dict[tuple, Fingerprint] = {}


def weights_fingerprint(model_dir: str | os.PathLike[str], mode: str = "sampled") -> Fingerprint:
    """The fingerprint of a checkpoint directory (or of a single weights file, e.g. a
    GGUF). FingerprintError when it cannot be read or holds no weights files."""
    if mode not in FINGERPRINT_MODES:
        raise ValueError(f"weights fingerprint mode {mode!r} (known: {', '.join(FINGERPRINT_MODES)})")
    d = Path(model_dir)
    try:
        if d.is_file():
            base, files, configs = d.parent, [d], []
        elif d.is_dir():
            base, files = d, _weights_files(d)
            configs = [d / n for n in CONFIG_FILES + INDEX_FILES if (d / n).is_file()]
        else:
            raise FingerprintError(f"{d} does not exist")
        if not files:
            raise FingerprintError(f"{d} holds no weights files (*.safetensors, {', '.join(OTHER_WEIGHTS)})")
        sig = tuple((str(p), st.st_size, st.st_mtime_ns, st.st_ino) for p in files + configs for st in [p.stat()])
    except OSError as e:
        if isinstance(e, FingerprintError):
            raise
        raise FingerprintError(f"{d}: {e.strerror or e}") from e
    key = (str(d.resolve()), mode, sig)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    r = _Reader(hashlib.blake2b(digest_size=32, person=b"kvring-wfp-v1"))
    r.h.update(mode.encode() + b"\0")
    total = 0
    try:
        for p in configs:
            b = p.read_bytes()
            r.read += len(b)
            r.h.update(f"config\0{p.name}\0{len(b)}\0".encode() + b)
        for p in files:
            total += _file(r, p, p.relative_to(base).as_posix(), mode)
    except OSError as e:
        raise FingerprintError(f"{d}: cannot read {getattr(e, 'filename', '') or ''}: {e.strerror or e}") from e
    fp = Fingerprint(
        kind=mode,
        digest=r.h.hexdigest(),
        path=str(d),
        files=len(files),
        weights_bytes=total,
        bytes_read=r.read,
        seconds=time.perf_counter() - t0,
    )
    if len(_cache) > 16:
        _cache.clear()
    _cache[key] = fp
    return fp


# ---- the namespace ---------------------------------------------------------------------------


def namespace_for(m: EngineModel, mode: str = "sampled", model_dir: str | os.PathLike[str] | None = None) -> Namespace:
    """The default namespace of an engine running `m` (no model_ns given). `model_dir`
    skips locating the checkpoint (tests)."""
    fp: Fingerprint | None = None
    why = ""
    d = Path(model_dir) if model_dir is not None else resolve_model_dir(m.model, m.revision, m.download_dir)
    if m.load_format == "dummy":
        why = "load_format dummy: vLLM makes up the weights"
    elif d is None:
        why = f"{m.model!r} is not a local path and not in the Hugging Face cache"
    else:
        try:
            fp = weights_fingerprint(d, mode)
        except FingerprintError as e:
            why = str(e)
    parts: dict[str, Any] = {"v": 1}
    if fp is not None:
        parts["weights"] = f"{fp.kind}:{fp.digest}"
        weights = parts["weights"]
    else:
        parts["weights"] = "name"
        parts["model"] = m.model
        parts["revision"] = m.revision or ""
        weights = "name"
    parts.update(
        dtype=m.dtype,
        quantization=m.quantization or "",
        kv_cache_dtype=m.kv_cache_dtype,
        block_size=m.block_size,
        layout=m.layout,
    )
    if m.load_format == "dummy":
        parts["load_format"] = "dummy"
    if m.hf_overrides:
        parts["hf_overrides"] = m.hf_overrides
    digest = hashlib.blake2b(
        json.dumps(parts, sort_keys=True, separators=(",", ":")).encode(), digest_size=16, person=b"kvring-ns-v1"
    ).hexdigest()[:DIGEST_HEX]
    label = model_label(m.model)
    ns = f"{label}@{digest}"
    assert len(ns.encode()) <= NS_MAX and ns.isprintable() and ns.isascii()
    return Namespace(
        ns=ns,
        explicit=False,
        label=label,
        fingerprint=fp,
        weights=weights,
        why_no_fingerprint=why,
        model=m,
        parts=parts,
    )


def derive(vllm_config: VllmConfig, cfg: ConnectorConfig, kv_cache_config: Any = None) -> Namespace:
    """The namespace this engine's connector attaches with: `cfg.model_ns` when given,
    else the default derived from what the engine runs."""
    if cfg.model_ns:
        return Namespace(ns=cfg.model_ns, explicit=True)
    return namespace_for(EngineModel.from_vllm_config(vllm_config, kv_cache_config), cfg.weights_fingerprint)
