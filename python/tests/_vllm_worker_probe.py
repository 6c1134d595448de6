"""A vLLM worker extension for the KV offloading tests (``worker_extension_cls`` /
``--worker-extension-cls _vllm_worker_probe.OffloadProbe``, with this folder on PYTHONPATH): methods
that ``collective_rpc`` (or the server's ``/collective_rpc`` in VLLM_SERVER_DEV_MODE) calls by name
in every worker process, whichever process layout the engine has (one process, several workers,
the API server's engine process)."""
from __future__ import annotations

from typing import Any, Dict


class OffloadProbe:
    def tz_offload_stats(self) -> Dict[str, Any]:
        """This worker's rank and the stats of its compressed block stores."""
        from tensorzip._vllm_offload import stats_of_this_process

        return {"rank": int(getattr(self, "rank", 0)), "stores": stats_of_this_process()}

    def tz_resident_stats(self) -> Any:
        """This worker's model's resident_stats when its weights are kept compressed, else None."""
        from tensorzip.resident import is_resident, resident_stats

        model = self.model_runner.model  # type: ignore[attr-defined]
        if not is_resident(model):
            return None
        return {k: v for k, v in resident_stats(model).items() if isinstance(v, (int, float, str, list))}

    def tz_poison_kv_cache(self) -> int:
        """Overwrites this worker's whole KV cache with a constant (a block neither recomputed nor
        loaded from its offloaded copy then gives other tokens); returns the bytes overwritten."""
        import torch

        n = 0
        for t in self.model_runner.kv_caches:  # type: ignore[attr-defined]
            t.view(-1).view(torch.int8).fill_(0x3F)
            n += t.numel() * t.element_size()
        return n
