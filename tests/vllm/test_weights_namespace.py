"""Other weights, same geometry, one kvringd (issue 22): the default namespace keeps them apart.

Four engines of the tiny model's geometry on one kvringd, default connector settings but
for D, two at a time (one core each). Every model directory is named ``tiny-llama`` (in
its own parent directory), so only the weights tell them apart:

- A: the suite's weights (seed 1234); B: another seed's weights (same config, same
  safetensors header and size). A's cold run stores a prompt; B's run of it hits 0 tokens
  and gives other tokens than A (the weights matter: a shared block would be a wrong
  answer); B's second run hits its own stored prefix and equals its own cold run.
- C: a copy of A's files in another directory: the same namespace as A; C hits every full
  block A stored and gives A's tokens and logprobs.
- D: B's weights with ``model_ns`` set to A's namespace (the operator's explicit choice
  to share): D hits A's prefix.

kvringd's log lists each engine with its namespace.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import kvtest as kt
from kvtest import BLOCK, check


def place(src: Path, parent: Path) -> Path:
    """A copy of a model directory as parent/tiny-llama (its files copied, not linked)."""
    dst = parent / "tiny-llama"
    dst.mkdir(parents=True)
    for f in src.iterdir():
        shutil.copy2(f, dst / f.name)
    return dst


def engine(d: Path, name: str, model: Path, kv: kt.Kvringd, core: str, **extra) -> kt.Engine:
    return kt.Engine(
        d,
        name,
        kv_transfer_config=kt.connector_config(kv.socket, **extra),
        threads_bind=core,
        llm_args={"model": str(model)},
        wait=False,
    )


def main(d: Path) -> None:
    seed_a = kt.tiny_model()
    seed_b = kt.tiny_model_seeded(kt.MODEL_SEED + 1)
    model_a = place(seed_a, d / "a")
    model_b = place(seed_b, d / "b")
    model_c = place(seed_a, d / "c")
    kv = kt.Kvringd(d)
    p = kt.prompt(71, 8 * BLOCK + 13)
    engines: list[kt.Engine] = []
    try:
        a = engine(d, "A", model_a, kv, "0")
        b = engine(d, "B", model_b, kv, "1")
        engines += [a, b]
        a.wait_started()
        b.wait_started()
        ns_a, ns_b = kt.engine_namespace(a), kt.engine_namespace(b)
        kt.log(f"A's namespace {ns_a}, B's {ns_b}")
        check(ns_a != ns_b, f"two different weights got one namespace {ns_a!r}")
        check(ns_a.startswith("tiny-llama@") and len(ns_a) <= 63, f"A's namespace {ns_a!r}")

        cold_a = a.generate([p])[0]
        check(cold_a["num_cached_tokens"] == 0, f"A's cold run hit {cold_a['num_cached_tokens']} tokens")
        kv.wait_metric("kvring_store_blocks_total", 8, result="stored")

        cold_b = b.generate([p])[0]
        check(cold_b["num_cached_tokens"] == 0, f"B (other weights) hit {cold_b['num_cached_tokens']} tokens of A's")
        check(
            cold_b["tokens"] != cold_a["tokens"],
            "A's and B's weights give the same tokens: the test cannot tell a shared block from its own",
        )
        kv.wait_metric("kvring_store_blocks_total", 16, result="stored")
        warm_b = b.generate([p])[0]
        check(warm_b["num_cached_tokens"] == 8 * BLOCK, f"B's own prefix: hit {warm_b['num_cached_tokens']}")
        check(kt.same_output(warm_b, cold_b), f"B warm {warm_b['tokens']} != B cold {cold_b['tokens']}")
        for e in (a, b):
            e.close()

        c = engine(d, "C", model_c, kv, "0")
        dd = engine(d, "D", model_b, kv, "1", model_ns=ns_a)
        engines += [c, dd]
        c.wait_started()
        dd.wait_started()
        ns_c, ns_d = kt.engine_namespace(c), kt.engine_namespace(dd)
        check(ns_c == ns_a, f"a copy of A's files in another directory: namespace {ns_c!r}, A's {ns_a!r}")
        check(ns_d == ns_a, f"D's model_ns {ns_a!r} was not used: {ns_d!r}")

        warm_c = c.generate([p])[0]
        check(warm_c["num_cached_tokens"] == 8 * BLOCK, f"C (A's weights, copied) hit {warm_c['num_cached_tokens']}")
        delta = kt.max_logprob_delta(cold_a, warm_c)
        check(delta <= 1e-4, f"C's output differs from A's: tokens {warm_c['tokens']} vs {cold_a['tokens']}, {delta}")

        shared_d = dd.generate([p])[0]
        check(
            shared_d["num_cached_tokens"] == 8 * BLOCK,
            f"D (B's weights, model_ns = A's) hit {shared_d['num_cached_tokens']}, want A's {8 * BLOCK}",
        )
        like_b = "equal to" if shared_d["tokens"] == cold_b["tokens"] else "unlike"
        kt.log(
            f"other weights: B hit 0 of A's prompt, own warm hit {warm_b['num_cached_tokens']}, equal to its cold; "
            f"copy C hit {warm_c['num_cached_tokens']} (delta {delta:.2g}); D with model_ns hit "
            f"{shared_d['num_cached_tokens']} (tokens {like_b} B's own)"
        )
    finally:
        for e in engines:
            e.close()
        rc = kv.stop()
    check(rc == 0, f"kvringd exited {rc} after SIGTERM:\n{kv.log_tail()}")
    log = kv.log_path.read_text(errors="replace")
    for ns in (ns_a, ns_b):
        check(f'model namespace "{ns}"' in log, f"kvringd's log does not list namespace {ns}")


if __name__ == "__main__":
    kt.run(main)
