"""The connector's options: ``kv_transfer_config.kv_connector_extra_config``, checked strictly.

Every key is optional. An unknown key, a value of the wrong type or out of range refuses
the configuration with a message naming the key, so a typo cannot silently run vLLM
without offload (vLLM then fails to start and prints it):

    kv_connector_extra_config: unknown key 'sockt' (known: engine_id, lease_ttl_ms, ...)

docs/vllm.md lists the keys with their meaning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ConnectorConfig", "ConfigError", "DEFAULT_SOCKET", "KEYS"]

DEFAULT_SOCKET = "/tmp/kvring.sock"  # kvringd's default instance.socket

_ENGINE_RE = re.compile(r"^[A-Za-z0-9._:-]{1,47}$")


class ConfigError(ValueError):
    """kv_connector_extra_config is not valid (the message names the key)."""


@dataclass(frozen=True)
class ConnectorConfig:
    socket: str = DEFAULT_SOCKET
    engine_id: str | None = None  # None: vLLM's kv_transfer_config.engine_id
    model_ns: str | None = None  # None: derived from the model, its weights and the KV format (namespace.py)
    weights_fingerprint: str = "sampled"  # how the default model_ns fingerprints the weights: sampled | full
    timeout_ms: int = 10000
    lease_ttl_ms: int = 30000
    reattach_interval_ms: int = 1000
    test_wrong_blocks: bool = False


# key -> (type, check, description)
KEYS: dict[str, tuple[type, str]] = {
    "socket": (str, "kvringd's socket path (instance.socket); it must exist when vLLM starts"),
    "engine_id": (str, "this engine's id at kvringd, 1..47 of [A-Za-z0-9._:-]; default: vLLM's engine id"),
    "model_ns": (
        str,
        "model namespace: engines with equal namespaces share blocks; default: derived from the model's name, "
        "a fingerprint of its weights, dtype, quantization, KV cache dtype, block size and layout",
    ),
    "weights_fingerprint": (
        str,
        "how the default model_ns fingerprints the weights: 'sampled' (headers, sizes and a few MB of content) "
        "or 'full' (every byte); unused when model_ns is given",
    ),
    "timeout_ms": (int, "ceiling of one kvring call and of the wait for a step's loads (1..600000)"),
    "lease_ttl_ms": (int, "a lookup lease not loaded or released within this ends by itself (1..3600000)"),
    "reattach_interval_ms": (int, "after kvringd went away, try to attach again at most this often (1..3600000)"),
    "test_wrong_blocks": (
        bool,
        "TESTS ONLY: load leased block i into the request's block i+1 (a wrong load vLLM is not told about)",
    ),
}


def _fail(key: str, why: str) -> ConfigError:
    return ConfigError(f"kv_connector_extra_config: {key}: {why}")


def parse(extra: dict[str, Any] | None) -> ConnectorConfig:
    """The checked configuration, or ConfigError naming the key."""
    extra = dict(extra or {})
    unknown = sorted(k for k in extra if k not in KEYS)
    if unknown:
        raise ConfigError(
            f"kv_connector_extra_config: unknown key{'s' if len(unknown) > 1 else ''} "
            + ", ".join(repr(k) for k in unknown)
            + " (known: "
            + ", ".join(sorted(KEYS))
            + ")"
        )
    out: dict[str, Any] = {}
    for k, v in extra.items():
        typ, _ = KEYS[k]
        if typ is bool:
            if not isinstance(v, bool):
                raise _fail(k, f"must be true or false, got {v!r}")
        elif typ is int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise _fail(k, f"must be an integer, got {v!r}")
        elif not isinstance(v, str):
            raise _fail(k, f"must be a string, got {v!r}")
        out[k] = v
    if "socket" in out and not out["socket"].startswith("/"):
        raise _fail("socket", f"must be an absolute path, got {out['socket']!r}")
    if "socket" in out and len(out["socket"].encode()) > 107:
        raise _fail("socket", "longer than a Unix socket path may be (107 bytes)")
    if "engine_id" in out and not _ENGINE_RE.match(out["engine_id"]):
        raise _fail("engine_id", f"{out['engine_id']!r} is not 1..47 characters of [A-Za-z0-9._:-]")
    if "model_ns" in out and not (1 <= len(out["model_ns"].encode()) <= 63 and out["model_ns"].isprintable()):
        raise _fail("model_ns", f"{out['model_ns']!r} is not 1..63 printable bytes")
    if "weights_fingerprint" in out and out["weights_fingerprint"] not in ("sampled", "full"):
        raise _fail(
            "weights_fingerprint",
            f"{out['weights_fingerprint']!r} is not 'sampled' or 'full' (to share blocks across models on purpose, "
            "set model_ns)",
        )
    for k, hi in (("timeout_ms", 600000), ("lease_ttl_ms", 3600000), ("reattach_interval_ms", 3600000)):
        if k in out and not 1 <= out[k] <= hi:
            raise _fail(k, f"out of range: {out[k]} (must be 1..{hi})")
    return ConnectorConfig(**out)
