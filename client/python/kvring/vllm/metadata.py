"""What the scheduler-side connector tells the workers each step (KVConnectorMetadata).

vLLM builds one metadata object per step in the scheduler process (build_connector_meta)
and hands it to every worker before the forward pass; with several worker processes it
is pickled, so it holds only plain values:

- `LoadSpec`: load a request's leased prefix into these engine blocks before the forward
  (the scheduler already told vLLM those tokens are computed);
- `StoreSpec` in `saves`: a request's full prompt blocks that this step's forward pass
  completes (its prefill ends in this step): the workers submit the store in
  wait_for_save, right after that forward pass, in the same step;
- `StoreSpec` in `stores`: a finished request's full blocks to store (deferred: requests
  that loaded from kvring, or finished before their prefill completed); the workers
  submit them at the start of the step, before its forward pass;
- `fence`: requests vLLM preempted in this step whose store may still be reading their
  blocks: the workers wait for those stores before the forward pass reuses the blocks.

For every store vLLM keeps the blocks until every worker reported it finished
(request_finished answers "free later"; get_finished -> finished_sending).

Request ids map to kvring's 64-bit ids with `lease_id`/`store_id`: a stable hash both
processes compute, so no id table has to travel between them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

__all__ = ["LoadSpec", "StoreSpec", "KvringConnectorMetadata", "lease_id", "store_id"]


def _h64(tag: bytes, request_id: str) -> int:
    v = int.from_bytes(hashlib.blake2b(tag + request_id.encode(), digest_size=8).digest(), "little")
    return v or 1  # 0 is never used as an id


def lease_id(request_id: str) -> int:
    """The kvring lease id of a vLLM request (scheduler and workers agree on it)."""
    return _h64(b"kvring-lease\0", request_id)


def store_id(request_id: str) -> int:
    """The kvring request id of a vLLM request's store."""
    return _h64(b"kvring-store\0", request_id)


@dataclass
class LoadSpec:
    req_id: str
    lease_id: int
    # engine block ids for leased blocks 0..len-1; the first `skip` of them are blocks
    # vLLM already holds (its own prefix cache): their load goes to the null block
    block_ids: list[int]
    skip: int
    num_tokens: int  # tokens the scheduler promised vLLM (len(block_ids) - skip blocks)


@dataclass
class StoreSpec:
    req_id: str
    store_id: int
    token_ids: list[int]  # whole blocks only
    block_ids: list[int]  # one per block of token_ids
    extra: bytes | None  # key bytes besides the tokens (LoRA, cache salt)


@dataclass
class KvringConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    stores: list[StoreSpec] = field(default_factory=list)  # deferred: submitted before the forward pass
    saves: list[StoreSpec] = field(default_factory=list)  # computed by this step: submitted after it
    fence: list[str] = field(default_factory=list)  # preempted requests whose stores must end first
    null_block: int = 0  # vLLM's null block (never read): target of skipped loads
