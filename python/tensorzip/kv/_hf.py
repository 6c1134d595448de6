"""A Hugging Face transformers cache that keeps past keys and values compressed
in host memory (doc/kv.md, "transformers"). Written against the Cache /
DynamicLayer API of transformers 5.x (cache_utils); imported by tensorzip.kv
on first use of TensorZipKVCache.

Each layer holds its past as pages of ``page_tokens`` tokens: full pages are
encoded (lossless, tables calibrated per layer and K/V from the first full
pages, i.e. the prompt) and kept as bytes in host memory; the last, partial
page stays uncompressed on the model's device. When the layer runs, its
pages are decoded (one batch call per tensor) and moved back to the device,
so attention sees exactly the keys and values a DynamicCache would hold:
generation is token-for-token identical.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from transformers.cache_utils import Cache, DynamicLayer

from . import PageCodec


class CompressedKVLayer(DynamicLayer):
    """One layer's past: encoded pages (host bytes) plus an uncompressed tail (``self.keys`` /
    ``self.values``, shape [batch, heads, tail, head_dim], on the model's device)."""

    def __init__(self, page_tokens: int = 16, codecs: Optional[Tuple[PageCodec, PageCodec]] = None,
                 mode: str = "rans", threads: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if page_tokens < 1:
            raise ValueError("page_tokens must be >= 1")
        self.page_tokens = int(page_tokens)
        self.codecs = codecs
        self.mode = mode
        self.threads = threads
        self.k_pages: List[bytes] = []
        self.v_pages: List[bytes] = []
        self._page_shape: Optional[Tuple[int, int, int, int]] = None  # (batch, heads, page_tokens, head_dim)

    # ---- storage -------------------------------------------------------------
    @property
    def compressed_tokens(self) -> int:
        return len(self.k_pages) * self.page_tokens

    def compressed_nbytes(self) -> int:
        return sum(len(b) for b in self.k_pages) + sum(len(b) for b in self.v_pages)

    def raw_nbytes(self) -> int:
        """Bytes the compressed pages hold once decoded."""
        if self._page_shape is None or not self.k_pages:
            return 0
        b, h, p, d = self._page_shape
        return 2 * len(self.k_pages) * b * h * p * d * self.keys.element_size()

    def _encode_pages(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Moves the full pages at the front of the tail into encoded pages."""
        p = self.page_tokens
        n = keys.shape[-2] // p
        if n == 0:
            return
        b, h, _, d = keys.shape
        self._page_shape = (b, h, p, d)

        def pages(t: torch.Tensor) -> torch.Tensor:  # (n, batch * heads * p * d), page i = tokens [i p, (i+1) p)
            full = t[:, :, : n * p, :].detach().to("cpu")
            return full.reshape(b, h, n, p, d).permute(2, 0, 1, 3, 4).contiguous().reshape(n, -1)

        kp, vp = pages(keys), pages(values)
        if self.codecs is None:  # tables of this layer from its first full pages (the prompt)
            self.codecs = (PageCodec.calibrate(kp.reshape(-1), mode=self.mode),
                           PageCodec.calibrate(vp.reshape(-1), mode=self.mode))
        self.k_pages += self.codecs[0].encode_batch(kp, self.threads)
        self.v_pages += self.codecs[1].encode_batch(vp, self.threads)
        self.keys = keys[:, :, n * p:, :]
        self.values = values[:, :, n * p:, :]

    def _decode_pages(self, which: int) -> Optional[torch.Tensor]:
        blobs = self.k_pages if which == 0 else self.v_pages
        if not blobs or self.codecs is None or self._page_shape is None:
            return None
        b, h, p, d = self._page_shape
        flat = self.codecs[which].decode_batch(blobs, framework="pt", threads=self.threads)  # (n, page elems)
        n = len(blobs)
        t = flat.reshape(n, b, h, p, d).permute(1, 2, 0, 3, 4).reshape(b, h, n * p, d)
        return t.to(self.device)

    def materialize(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """All past keys and values, [batch, heads, seq, head_dim] on the model's device."""
        k, v = self._decode_pages(0), self._decode_pages(1)
        keys = self.keys if k is None else torch.cat([k, self.keys], dim=-2)
        values = self.values if v is None else torch.cat([v, self.values], dim=-2)
        return keys, values

    def _repage(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.k_pages, self.v_pages = [], []
        self.keys, self.values = keys, values
        self._encode_pages(keys, values)

    # ---- the CacheLayerMixin interface -----------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        self._encode_pages(self.keys, self.values)
        return self.materialize()

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        tail = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        return self.compressed_tokens + tail

    def offload(self) -> None:  # pages already live in host memory; the tail is small
        pass

    def prefetch(self) -> None:
        pass

    def reset(self) -> None:
        self.k_pages, self.v_pages = [], []
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        keys, values = self.materialize()
        self._repage(keys[..., :tokens_to_remove, :], values[..., :tokens_to_remove, :])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            keys, values = self.materialize()
            idx = beam_idx.to(keys.device)
            self._repage(keys.index_select(0, idx), values.index_select(0, idx))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            keys, values = self.materialize()
            self._repage(keys.repeat_interleave(repeats, dim=0), values.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            keys, values = self.materialize()
            self._repage(keys[indices, ...], values[indices, ...])


class TensorZipKVCache(Cache):
    """A transformers ``Cache`` whose layers keep past keys and values losslessly compressed in
    host memory (:class:`CompressedKVLayer`). Pass it to ``generate(..., cache=cache)`` (the
    ``cache`` keyword of transformers 5.x) or to a forward call.

    Args:
        page_tokens: tokens per encoded page (16 to 256 is typical; the last partial page stays
            uncompressed on the device).
        mode: ``"rans"`` (best ratio) or ``"fixed"`` (faster, ~1.43x on BF16).
        codecs: optional pre-calibrated tables, ``{layer_idx: (keys_codec, values_codec)}``;
            layers without an entry calibrate on their first full pages.
        threads: coding threads per batch call (0 = all).
    """

    def __init__(self, page_tokens: int = 16, mode: str = "rans",
                 codecs: Optional[Dict[int, Tuple[PageCodec, PageCodec]]] = None, threads: int = 0) -> None:
        self._layer_args = (page_tokens, mode, dict(codecs or {}), threads)
        super().__init__(layer_class_to_replicate=self._new_layer)

    def _new_layer(self) -> CompressedKVLayer:
        page_tokens, mode, codecs, threads = self._layer_args
        return CompressedKVLayer(page_tokens=page_tokens, codecs=codecs.get(len(self.layers)), mode=mode,
                                 threads=threads)

    def codecs(self) -> Dict[int, Tuple[PageCodec, PageCodec]]:
        """The tables each layer uses (to reuse them in another cache)."""
        return {i: layer.codecs for i, layer in enumerate(self.layers) if layer.codecs is not None}

    def compressed_nbytes(self) -> int:
        return sum(layer.compressed_nbytes() for layer in self.layers)

    def raw_nbytes(self) -> int:
        return sum(layer.raw_nbytes() for layer in self.layers)
