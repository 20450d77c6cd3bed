"""The connector's options: ``kv_transfer_config.kv_connector_extra_config``, checked strictly.

Every key is optional. An unknown key, a value of the wrong type or out of range refuses
the configuration with a message naming the key, so a typo cannot silently run vLLM
without offload (vLLM then fails to start and prints it):

    kv_connector_extra_config: unknown key 'sockt' (known: engine_id, lease_ttl_ms, ...)

docs/vllm.md lists the keys with their meaning.

Which kvringd the connector attaches to, first that applies (resolve_socket):

1. ``socket`` in kv_connector_extra_config;
2. ``$KVRING_SOCKET`` (absolute; empty counts as unset);
3. ``/run/kvring/kvring.sock`` when it exists: the installed service's socket
   (dist/kvringd.json, docs/service.md);
4. ``/tmp/kvring.sock``: kvringd's built-in instance.socket.

``ConnectorConfig.socket_from`` says which, for the messages that name the path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ConnectorConfig",
    "ConfigError",
    "DEFAULT_SOCKET",
    "KEYS",
    "SERVICE_SOCKET",
    "SOCKET_ENV",
    "resolve_socket",
]

DEFAULT_SOCKET = "/tmp/kvring.sock"  # kvringd's built-in instance.socket (KVR_CONFIG_DEFAULT_SOCKET)
SERVICE_SOCKET = "/run/kvring/kvring.sock"  # the installed service's (kvring.service's RuntimeDirectory)
SOCKET_ENV = "KVRING_SOCKET"
_SUN_PATH_MAX = 107  # bytes of a Unix socket path, without its NUL

_ENGINE_RE = re.compile(r"^[A-Za-z0-9._:-]{1,47}$")


class ConfigError(ValueError):
    """kv_connector_extra_config is not valid (the message names the key)."""


def resolve_socket() -> tuple[str, str]:
    """The socket to use when kv_connector_extra_config names none: (path, where it came from).

    $KVRING_SOCKET when set and not empty, else SERVICE_SOCKET when it exists, else
    DEFAULT_SOCKET. A $KVRING_SOCKET that is not an absolute path of at most 107 bytes
    raises ConfigError naming it."""
    env = os.environ.get(SOCKET_ENV, "")
    if env:
        if not env.startswith("/"):
            raise ConfigError(f"${SOCKET_ENV}: must be an absolute path, got {env!r}")
        if len(env.encode()) > _SUN_PATH_MAX:
            raise ConfigError(f"${SOCKET_ENV}: longer than a Unix socket path may be ({_SUN_PATH_MAX} bytes)")
        return env, f"${SOCKET_ENV}"
    if os.path.exists(SERVICE_SOCKET):
        return SERVICE_SOCKET, "the default: the kvring service's socket"
    return DEFAULT_SOCKET, (
        f"the default: no ${SOCKET_ENV} and no {SERVICE_SOCKET} (the kvring service's), so kvringd's built-in "
        "instance.socket"
    )


@dataclass(frozen=True)
class ConnectorConfig:
    socket: str = ""  # "": resolve_socket() decides, when the config is made
    # where socket came from: "kv_connector_extra_config.socket", "$KVRING_SOCKET" or "the default: ..."
    socket_from: str = ""
    engine_id: str | None = None  # None: vLLM's kv_transfer_config.engine_id
    model_ns: str | None = None  # None: derived from the model, its weights and the KV format (namespace.py)
    weights_fingerprint: str = "sampled"  # how the default model_ns fingerprints the weights: sampled | full
    timeout_ms: int = 10000
    lease_ttl_ms: int = 30000
    reattach_interval_ms: int = 1000
    store_wait_ms: int = 1000
    layered_loads: str = "auto"  # on | off | auto (the backend's default: LAYERED_DEFAULT)
    test_wrong_blocks: bool = False

    def __post_init__(self) -> None:
        # frozen: set once here, so every copy (dataclasses.replace) keeps the resolved path
        if not self.socket:
            path, origin = resolve_socket()
            object.__setattr__(self, "socket", path)
            object.__setattr__(self, "socket_from", origin)
        elif not self.socket_from:
            object.__setattr__(self, "socket_from", "kv_connector_extra_config.socket")


# key -> (type, check, description)
KEYS: dict[str, tuple[type, str]] = {
    "socket": (
        str,
        "kvringd's socket path (instance.socket); it must exist when vLLM starts; default: $KVRING_SOCKET, else "
        "/run/kvring/kvring.sock when it exists (the kvring service), else /tmp/kvring.sock",
    ),
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
    "store_wait_ms": (
        int,
        "a request whose prefix a store in flight is writing (another engine's prefill, or a prefill whose "
        "kv_transfer_params it carries) waits up to this long for the commit instead of recomputing "
        "(0..600000; 0 = never wait)",
    ),
    "layered_loads": (
        str,
        "'on': a step's loads are copied layer by layer and the forward pass starts on a layer as soon as it is "
        "in place (wait_for_layer_load); 'off': the step waits for its whole loads first; 'auto' (default): "
        "what measured faster on the KV memory's backend (docs/vllm.md)",
    ),
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
    if "socket" in out and len(out["socket"].encode()) > _SUN_PATH_MAX:
        raise _fail("socket", f"longer than a Unix socket path may be ({_SUN_PATH_MAX} bytes)")
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
    if "layered_loads" in out and out["layered_loads"] not in ("on", "off", "auto"):
        raise _fail("layered_loads", f"{out['layered_loads']!r} is not 'on', 'off' or 'auto'")
    if "store_wait_ms" in out and not 0 <= out["store_wait_ms"] <= 600000:
        raise _fail("store_wait_ms", f"out of range: {out['store_wait_ms']} (must be 0..600000)")
    return ConnectorConfig(**out)
