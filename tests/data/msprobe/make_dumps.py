"""Write the msprobe dumps the import tests read (run with mindstudio-probe installed, from the checkout):

    python tests/data/msprobe/make_dumps.py OUT_DIR

``OUT_DIR/sdpa``: a tiny CPU model whose attention calls ``torch.nn.functional.scaled_dot_product_attention``
with MLA's head split (q/k 192 = 128 + 64, v 128): a bf16 causal call with the default scale, an fp16 call
without a mask whose scale is passed by keyword, and a call with head dim 64 (not MLA: listed, skipped).
``OUT_DIR/npu``: the stand-in torch_npu of tests/fake_torch_npu.py (the public op names and signatures), so
msprobe records ``NPU.npu_ring_mla`` and ``NPU.npu_fused_infer_attention_score`` as it would on an NPU:
``npu_ring_mla`` called entirely by keyword (vllm-ascend's and sglang's form), a second ring call that merges
a previous ring's output (``calc_type_default``: cannot be recovered), and a TND call of the FIA op.
Each dump is msprobe's ``task: tensor``, ``level: L1`` PyTorch dump (``step0/proc<pid>/dump.json`` and
``dump_tensor_data/*.pt``), each written by its own process (msprobe's debugger is a singleton).  The seeds
are fixed; the process id in the folder name is not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.fake_torch_npu import install_for_process

install_for_process()  # before msprobe looks for torch_npu: it then hooks the stand-in's ops as NPU APIs
import torch_npu  # type: ignore[import-not-found]  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # type: ignore[import-not-found]  # noqa: E402


class Attention(torch.nn.Module):
    """Three SDPA calls: MLA bf16 causal, MLA fp16 unmasked with a scale, and a 64-dim head (not MLA)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        plain = torch.nn.functional.scaled_dot_product_attention(q.half(), k.half(), v.half(), scale=0.0625)
        small = torch.nn.functional.scaled_dot_product_attention(q[..., :64], k[..., :64], v[..., :64])
        return causal + plain.to(causal.dtype) + small.sum()


def _debugger(out: Path) -> PrecisionDebugger:
    config = {
        "task": "tensor",
        "dump_path": str(out),
        "rank": [],
        "step": [],
        "level": "L1",
        "tensor": {"scope": [], "list": [], "data_mode": ["forward"]},
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(json.dumps(config))
    debugger = PrecisionDebugger(config_path=str(path))
    path.unlink()
    return debugger


def dump_sdpa(out: Path) -> None:
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 5, 192, generator=generator).to(torch.bfloat16)
    k = torch.randn(2, 2, 5, 192, generator=generator).to(torch.bfloat16)
    v = torch.randn(2, 2, 5, 128, generator=generator).to(torch.bfloat16)
    debugger = _debugger(out)
    debugger.start()
    Attention()(q, k, v)
    debugger.stop()
    debugger.step()


def dump_npu(out: Path) -> None:
    generator = torch.Generator().manual_seed(2)
    dtype, heads, lens = torch.bfloat16, 2, [2, 4]
    tokens = sum(lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    q, q_rope, k, k_rope, v = (
        rand(tokens, heads, 128),
        rand(tokens, heads, 64),
        rand(tokens, heads, 128),
        rand(tokens, heads, 64),
        rand(tokens, heads, 128),
    )
    mask = torch.where(torch.ones(512, 512, dtype=torch.bool).triu(1), 1.0, 0.0).to(dtype)
    seqlen = torch.tensor([lens, lens], dtype=torch.int32)
    ring = dict(q_nope=q, q_rope=q_rope, k_nope=k, k_rope=k_rope, value=v, mask=mask, seqlen=seqlen)
    modes = dict(kernel_type="kernel_type_high_precision", mask_type="mask_type_triu", input_layout="type_bsnd")
    debugger = _debugger(out)
    debugger.start()
    first, lse = torch_npu.atb.npu_ring_mla(
        **ring, head_num=heads, kv_head_num=heads, qk_scale=0.0721, calc_type="calc_type_first_ring", **modes
    )
    torch_npu.atb.npu_ring_mla(
        **ring, head_num=heads, kv_head_num=heads, pre_out=first, prev_lse=lse, calc_type="calc_type_default", **modes
    )
    torch_npu.npu_fused_infer_attention_score(
        q,
        k,
        v,
        query_rope=q_rope,
        key_rope=k_rope,
        actual_seq_lengths=[2, 6],
        actual_seq_lengths_kv=[2, 6],
        num_heads=heads,
        scale=0.0721,
        input_layout="TND",
        num_key_value_heads=heads,
        sparse_mode=0,
    )
    debugger.stop()
    debugger.step()


if __name__ == "__main__":
    target = Path(sys.argv[1])
    if len(sys.argv) > 2:  # one dump per process: msprobe's debugger is a process-wide singleton
        {"sdpa": dump_sdpa, "npu": dump_npu}[sys.argv[2]](target / sys.argv[2])
    else:
        for which in ("sdpa", "npu"):
            subprocess.run([sys.executable, __file__, str(target), which], check=True)
