"""Time to load a big transformers checkpoint through `load_target` (issue 42: "the time to load
a 1 GB checkpoint"), and the memory it takes, against the weights' own size.

A random ``LlamaForCausalLM`` of about ``--gb`` GB in float32 is saved with ``save_pretrained``
into a temporary folder (untimed); a fresh subprocess then loads it through `load_target` (the
user's path: ``from_pretrained`` from safetensors, the ``draftgraph`` attention, the load probe)
and reports the wall time and its peak RSS over the baseline after imports. Peak RSS near one
copy of the weights means no second copy is held while loading.

    python -m scripts.bench_load [--gb 1.0] [--dtype float32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchutil import emit, record

# VmRSS / VmHWM of /proc/self/status (ru_maxrss would carry the parent's peak across exec)
CHILD = r"""
import json, sys, time
from draftgraph.runtime.models.hf_load import load_target
def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))
base = kib("VmRSS")
start = time.perf_counter()
target = load_target(sys.argv[1], dtype=sys.argv[2], max_len=64)
seconds = time.perf_counter() - start
params = sum(p.numel() * p.element_size() for p in target.model.parameters())
print(json.dumps({"seconds": seconds, "base_mib": base / 1024, "peak_mib": kib("VmHWM") / 1024,
                  "weights_mib": params / 2**20}))
"""


def _save(folder: Path, gb: float) -> float:
    """A random Llama of about ``gb`` GB (float32; at least one layer) saved into ``folder``; its
    size in GB."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, vocab = (1536, 32000) if gb >= 0.5 else (256, 4096)
    per_layer = 16 * hidden * hidden  # q, k, v, o (4 H^2) and the MLP (3 * H * 4H)
    layers = max(1, round((gb * 2**30 / 4 - 2 * vocab * hidden) / per_layer))
    config = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 128, num_key_value_heads=hidden // 128, vocab_size=vocab,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(folder)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**30


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=1.0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="a checkpoint of a few MB (a smoke test)")
    a = p.parse_args(argv)
    if a.quick:
        a.gb = 0.01
    with tempfile.TemporaryDirectory(prefix="bench_load-") as tmp:
        folder = Path(tmp) / "model"
        t0 = time.perf_counter()
        size = _save(folder, a.gb)
        save_s = time.perf_counter() - t0
        out = subprocess.run([sys.executable, "-c", CHILD, str(folder), a.dtype], capture_output=True, text=True,
                             timeout=900, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the loading process failed (rc {out.returncode}): {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    rows = [{"checkpoint_gb": round(size, 3), "dtype": a.dtype, "save_s": round(save_s, 1),
             "load_s": round(r["seconds"], 2), "weights_mib": round(r["weights_mib"]),
             "rss_before_mib": round(r["base_mib"]), "rss_peak_mib": round(r["peak_mib"]),
             "peak_over_weights": round((r["peak_mib"] - r["base_mib"]) / r["weights_mib"], 2)}]
    extra = {"records": [record("load", f"load_target {size:.2f} GB", {"dtype": a.dtype}, "seconds",
                                [r["seconds"]], backend="-")],
             "loader": "load_target (from_pretrained, safetensors, in a fresh process)"}
    return emit("load", rows, list(rows[0]), extra, a.json)


if __name__ == "__main__":
    main()
