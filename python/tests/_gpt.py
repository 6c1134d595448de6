"""The fixture GPT of ../shared/fixtures/make_fixture.py, for tests and benchmarks.

Same modules, names and arithmetic as the training script, with two changes that
do not alter fp32/bf16 results: the causal mask fill value is the dtype's lowest
finite value instead of -1e9 (which overflows float16), and positions are made on
the input's device. The number of blocks follows the weights given: the repo's
sample/ file holds block 0 of the real step-400 model (tok, pos, blocks.0, lnf,
head), ../shared/fixtures the whole 6-block model.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample" / "gpt-small-step400-model-bf16.safetensors"
# TZ_GPT_FIXTURE: the whole model elsewhere (bench/gpu/run.sh carries it in .device-data/).
FULL = Path(os.environ.get("TZ_GPT_FIXTURE") or
            REPO.parent / "shared" / "fixtures" / "gpt-small-step400-model-bf16.safetensors")
D, H, T = 256, 8, 256


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1 = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.proj = nn.Linear(D, D); s.ln2 = nn.LayerNorm(D)
        s.fc1 = nn.Linear(D, 4 * D); s.fc2 = nn.Linear(4 * D, D)

    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(D, 2)
        q, k, v = [z.view(b, t, H, D // H).transpose(1, 2) for z in (q, k, v)]
        a = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        a = a.masked_fill(mask, torch.finfo(a.dtype).min).softmax(-1)
        x = x + s.proj((a @ v).transpose(1, 2).reshape(b, t, D))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))


class GPT(nn.Module):
    def __init__(s, n_layers: int):
        super().__init__()
        s.tok = nn.Embedding(256, D); s.pos = nn.Embedding(T, D)
        s.blocks = nn.ModuleList([Block() for _ in range(n_layers)])
        s.lnf = nn.LayerNorm(D); s.head = nn.Linear(D, 256, bias=False)

    def forward(s, i):
        x = s.tok(i) + s.pos(torch.arange(i.shape[1], device=i.device))
        for b in s.blocks:
            x = b(x)
        return s.head(s.lnf(x))


def state_dict_of(path: Path) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def n_layers_of(sd: Dict[str, torch.Tensor]) -> int:
    return 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))


def gpt(path: Path = SAMPLE, dtype: Optional[torch.dtype] = None) -> GPT:
    """The fixture GPT with the real step-400 weights of `path`, cast to dtype (default: as stored, BF16)."""
    sd = state_dict_of(path)
    m = GPT(n_layers_of(sd))
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    m.load_state_dict(sd, assign=True)
    return m.eval()


def real_text_ids(n: int = T, offset: int = 0) -> torch.Tensor:
    """n bytes of real Python source (this repository's own code) as a (1, n) batch of byte ids."""
    src = (REPO / "python" / "tensorzip" / "_file.py").read_bytes()
    return torch.tensor(list(src[offset:offset + n]), dtype=torch.long).unsqueeze(0)
