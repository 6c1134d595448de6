"""vLLM KV offloading with compressed host memory: ``TensorZipOffloadingSpec`` (doc/kv.md
"vLLM KV offloading"), re-exported by ``tensorzip.vllm``::

    kv_transfer_config={"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"spec_name": "TensorZipOffloadingSpec",
                                                      "spec_module_path": "tensorzip.vllm",
                                                      "cpu_bytes_to_use": 1 << 30}}

The scheduler side (:class:`TensorZipOffloadingManager`) keeps an :class:`OffloadIndex` whose
byte budget is ``cpu_bytes_to_use``, charged with the compressed bytes each block really holds;
the worker side (:class:`TensorZipOffloadingWorker`) encodes each stored block's pages with the
KV page codec into a :class:`CompressedBlockStore` and decodes them back into the KV cache on load.
This module imports vLLM; ``tensorzip.vllm`` imports it on first use of the spec's name.
"""
from __future__ import annotations

import atexit
import logging
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    PrepareStoreOutput,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig

from ._core import UsageError
from ._kv_offload import (PAGE_HEADER_BYTES, CompressedBlockStore, OffloadIndex, SlotSizes, kv_dtype_of, put_blocks,
                          take_blocks)

__all__ = ["TensorZipOffloadingSpec", "TensorZipOffloadingManager", "TensorZipOffloadingWorker", "OPTIONS"]

logger = logging.getLogger("vllm.tensorzip")

#: kv_connector_extra_config keys of this spec (besides vLLM's own: spec_name, spec_module_path,
#: cpu_bytes_to_use, block_size, blocks_per_chunk, offload_prompt_only, ...).
OPTIONS = {
    "compress": "true (default): blocks held encoded; false: plain copies (the uncompressed baseline)",
    "mode": '"rans" (default, the best ratio) or "fixed" (faster, ~1.43x on BF16)',
    "threads": "CPU threads that encode / decode a transfer (default 0: all)",
    "tables_dir": "a folder of tables saved earlier (tensor-<i>.tzkv; with several workers "
                  "tensor-<i>.rank-<r>.tzkv), used while they pay; tables calibrated in the run are "
                  "written there when it lacks them",
    "max_blocks_ratio": "most blocks held per raw block that cpu_bytes_to_use could hold (default 4)",
    "device_codec": "true (default): a KV cache on a CUDA device is coded there when this build has the "
                    "KV codec's CUDA kernels (only encoded bytes cross to host memory); false: blocks are "
                    "copied to host memory and coded on the CPU",
}


def _option(extra: Any, key: str, default: Any, kind: type) -> Any:
    v = extra.get(key, default)
    if kind is bool and not isinstance(v, bool):
        raise UsageError(f"kv_connector_extra_config: {key} must be true or false, got {v!r}")
    if kind in (int, float) and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
        raise UsageError(f"kv_connector_extra_config: {key} must be a number >= 0, got {v!r}")
    if kind is str and v is not None and not isinstance(v, (str, os.PathLike)):
        raise UsageError(f"kv_connector_extra_config: {key} must be a string, got {v!r}")
    return v


class TensorZipSlots(BlockIDsLoadStoreSpec):
    """Where blocks are in the compressed store: ``block_ids`` are slots. A store also names the
    slots evicted to make room (``drop``: the worker frees them first) and the index generation
    (a newer one: the index was reset, the worker frees everything)."""

    def __init__(self, slots: Sequence[int], drop: Sequence[int] = (), generation: int = 0):
        super().__init__(list(slots))
        self.drop = [int(s) for s in drop]
        self.generation = int(generation)


class TensorZipOffloadingManager(OffloadingManager):
    """Scheduler side: an :class:`OffloadIndex` over slots, charged with the bytes held."""

    def __init__(self, index: OffloadIndex, sizes: SlotSizes, enable_events: bool = False):
        self.index, self.sizes = index, sizes
        self.generation = 0
        self.events: Optional[List[OffloadingEvent]] = [] if enable_events else None

    def lookup(self, key: Any, req_context: Any) -> LookupResult:
        state = self.index.state(key)
        return LookupResult.MISS if state is None else (LookupResult.HIT if state == "ready" else LookupResult.HIT_PENDING)

    def get_load_source(self, key: Any, req_context: Any) -> Any:
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        return CacheHitSource.HOST

    def prepare_load(self, keys: Any, req_context: Any) -> LoadStoreSpec:
        return TensorZipSlots(self.index.prepare_load(keys), generation=self.generation)

    def touch(self, keys: Any, req_context: Any) -> None:
        self.index.touch(keys)

    def complete_load(self, keys: Any, req_context: Any) -> None:
        self.index.complete_load(keys)

    def prepare_store(self, keys: Any, req_context: Any) -> Optional[PrepareStoreOutput]:
        plan = self.index.prepare_store(list(keys))
        if plan is None:
            return None
        if plan.evicted and self.events is not None:
            self.events.append(OffloadingEvent(keys=plan.evicted, medium=Medium.CPU, removed=True))
        return PrepareStoreOutput(keys_to_store=plan.keys,
                                  store_spec=TensorZipSlots(plan.slots, plan.drop, self.generation),
                                  evicted_keys=plan.evicted)

    def complete_store(self, keys: Any, req_context: Any, success: bool = True) -> None:
        sizes = _SizesOf(self.sizes)
        done = self.index.complete_store(keys, sizes, success)
        if done and self.events is not None:
            self.events.append(OffloadingEvent(keys=done, medium=Medium.CPU, removed=False))

    def on_new_request(self, req_context: Any) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def reset_cache(self) -> None:
        self.index.reset()
        self.generation += 1

    def take_events(self):
        if self.events:
            yield from self.events
            self.events.clear()

    def shutdown(self) -> None:
        self.sizes.unlink()


class _SizesOf:
    """slot -> bytes held, summed over the workers (read when a store completes)."""

    def __init__(self, sizes: SlotSizes):
        self._sizes = sizes

    def __getitem__(self, slot: int) -> int:
        return self._sizes.total(slot)


def device_codec_usable(tensors: Sequence[torch.Tensor], store: CompressedBlockStore, wanted: bool) -> bool:
    """Whether a worker codes on the KV cache's device: asked for (``device_codec``), a compressing
    store, every KV tensor on a CUDA device, and the KV codec's CUDA kernels built with a device
    visible (``tensorzip.kv.cuda_available()``)."""
    if not (wanted and store.compress and tensors and all(t.is_cuda for t in tensors)):
        return False
    from .kv import cuda_available

    return cuda_available()


class TensorZipOffloadingWorker(OffloadingWorker):
    """Worker side: stores copy each block's pages out of the KV cache and encode them; loads decode
    them into the KV cache. Each transfer runs when it is submitted and is reported finished by the
    next :meth:`get_finished`. A KV cache on a CUDA device is coded there (``device_codec``, see
    :func:`device_codec_usable`): a store gathers the blocks on the device, encodes them there and
    copies only the encoded bytes to host memory; a load copies the encoded bytes to the device,
    decodes them there and scatters them into the KV cache. Otherwise the blocks cross to host
    memory and the codec runs on ``threads`` CPU threads. The store holds the same bytes either way."""

    def __init__(self, kv_caches: CanonicalKVCaches, store: CompressedBlockStore, device_codec: bool = True):
        self.store = store
        # (num_blocks, page bytes) int8 views of the KV cache tensors.
        self.tensors = [t.tensor.view(torch.int8).view(t.tensor.shape[0], -1) if t.tensor.dim() != 2
                        else t.tensor.view(torch.int8) for t in kv_caches.tensors]
        self.on_device = device_codec_usable(self.tensors, store, device_codec)
        # Per KV cache group: the KV tensors its layers use, each once.
        self.group_tensors = [list(dict.fromkeys(ref.tensor_idx for ref in refs)) for refs in kv_caches.group_data_refs]
        self._finished: List[TransferResult] = []

    def _groups(self, gpu: GPULoadStoreSpec, slots: TensorZipSlots):
        sizes = list(gpu.group_sizes)
        if len(sizes) != len(self.group_tensors) or sum(sizes) != len(slots.block_ids) \
                or len(gpu.block_ids) != len(slots.block_ids):
            raise UsageError(f"KV offloading: a transfer of {len(gpu.block_ids)} KV blocks in groups {sizes} "
                             f"for {len(slots.block_ids)} offloaded blocks (one offloaded block per KV block "
                             f"and group expected)")
        start = 0
        for g, n in enumerate(sizes):
            if n:
                yield g, gpu.block_ids[start:start + n], slots.block_ids[start:start + n]
            start += n

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, TensorZipSlots)
        t0 = time.perf_counter()
        if dst_spec.generation < self.store.generation:
            # Planned before the index was reset: vLLM discards its result; nothing is stored.
            self._finished.append(TransferResult(job_id, True, 0, 0.0))
            return True
        if dst_spec.generation > self.store.generation:
            self.store.clear(dst_spec.generation)  # the index was reset: every held block is gone
        self.store.drop(dst_spec.drop)
        raw = 0
        for g, blocks, slots in self._groups(src_spec, dst_spec):
            rows = {t: take_blocks(self.tensors[t], blocks, self.store.page_bytes[t], self.on_device)
                    for t in self.group_tensors[g]}
            raw += self.store.store(slots.tolist(), rows)
        self._finished.append(TransferResult(job_id, True, raw, time.perf_counter() - t0))
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, TensorZipSlots)
        t0 = time.perf_counter()
        raw = 0
        empty = self._device_rows if self.on_device else None
        for g, blocks, slots in self._groups(dst_spec, src_spec):
            decoded = self.store.load(slots.tolist(), self.group_tensors[g], empty)
            for t, rows in decoded.items():
                raw += put_blocks(self.tensors[t], blocks, rows)
        self._finished.append(TransferResult(job_id, True, raw, time.perf_counter() - t0))
        return True

    def _device_rows(self, n: int, page_bytes: int) -> torch.Tensor:
        return torch.empty((n, page_bytes), dtype=torch.uint8, device=self.tensors[0].device)

    def get_finished(self) -> List[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: Any) -> None:
        return  # every transfer is done when submitted


class TensorZipOffloadingSpec(OffloadingSpec):
    """An ``OffloadingSpec`` whose host memory holds KV blocks compressed by the KV page codec."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        extra = self.extra_config
        budget = extra.get("cpu_bytes_to_use")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise UsageError(f"kv_connector_extra_config: cpu_bytes_to_use must be a positive integer "
                             f"(bytes of host memory for offloaded KV), got {budget!r}")
        if self.blocks_per_chunk != 1:
            raise UsageError(f"kv_connector_extra_config: block_size must equal the KV cache's block size "
                             f"{self.tokens_per_block[0] if self.tokens_per_block else '?'} (one offloaded block "
                             f"per KV block; got {self.blocks_per_chunk} KV blocks per offloaded block)")
        self.budget = int(budget)
        self.compress = _option(extra, "compress", True, bool)
        self.mode = extra.get("mode", "rans")
        if self.mode not in ("rans", "fixed"):
            raise UsageError(f'kv_connector_extra_config: mode must be "rans" or "fixed", got {self.mode!r}')
        self.threads = int(_option(extra, "threads", 0, int))
        self.tables_dir = _option(extra, "tables_dir", None, str)
        max_ratio = float(_option(extra, "max_blocks_ratio", 4, float))
        self.device_codec = _option(extra, "device_codec", True, bool)
        self.kv_dtype = kv_dtype_of(config.model.dtype) if self.compress else None
        world = max(1, config.parallel.world_size)
        raw_block = config.worker_kv_bytes_per_block * world
        n_layers = sum(len(g.layer_names) for g in config.groups)
        # The most a block can hold: its pages stored raw, each behind a page header (one page per
        # layer and worker; fewer when layers share a KV tensor).
        self.reserve = raw_block + (PAGE_HEADER_BYTES * n_layers * world if self.compress else 0)
        self.num_slots = max(1, int(max_ratio * self.budget // max(1, raw_block)))
        self._manager: Optional[TensorZipOffloadingManager] = None
        self._worker: Optional[TensorZipOffloadingWorker] = None

    def _sizes(self) -> SlotSizes:
        return SlotSizes(self.config.engine_id, max(1, self.config.parallel.world_size), self.num_slots)

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            index = OffloadIndex(self.budget, self.reserve, self.num_slots)
            sizes = self._sizes()
            atexit.register(sizes.unlink)  # also where vLLM never shuts the manager down
            self._manager = TensorZipOffloadingManager(index, sizes, self.kv_events_config.enable_kv_cache_events)
            logger.info("tensorzip: KV offloading to host memory, %d bytes, %s (at most %d blocks of %d raw bytes)",
                        self.budget, "compressed" if self.compress else "uncompressed", self.num_slots, self.reserve)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            pages = _page_bytes(kv_caches)
            store = CompressedBlockStore(self.kv_dtype or "", pages, compress=self.compress, mode=self.mode,
                                         threads=self.threads, tables_dir=self.tables_dir, sizes=self._sizes(),
                                         rank=self.config.parallel.rank,
                                         ranks=max(1, self.config.parallel.world_size))
            self._worker = TensorZipOffloadingWorker(kv_caches, store, self.device_codec)
            logger.info("tensorzip: KV blocks coded %s", "on the KV cache's CUDA device" if self._worker.on_device
                        else "on the CPU")
        return self._worker


def _page_bytes(kv_caches: CanonicalKVCaches) -> List[int]:
    """Bytes of one block of each KV tensor that its layers use (padding excluded)."""
    pages = [0] * len(kv_caches.tensors)
    for refs in kv_caches.group_data_refs:
        for ref in refs:
            pages[ref.tensor_idx] = max(pages[ref.tensor_idx], int(ref.page_size_bytes))
    for i, t in enumerate(kv_caches.tensors):
        if pages[i] == 0:
            pages[i] = int(t.page_size_bytes)
    return pages


def stats_of_this_process() -> List[Dict[str, Any]]:
    """The stats of every compressed block store of this process (e.g. through
    ``llm.collective_rpc`` / ``apply_model`` in the worker)."""
    from ._kv_offload import live_stores

    return [s.stats() for s in live_stores()]
