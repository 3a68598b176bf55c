"""Write the measured tables of this folder from microsoft/vidur's profiling data.

vidur (https://github.com/microsoft/vidur, MIT licence) publishes per-operator CUDA
kernel times (Kineto, fp16, median of repeated runs, milliseconds) of Llama-shaped layers
on A100 and H100 (``data/profiling/compute/<gpu>/<org>/<model>/mlp.csv``: the QKV,
output, up and down projections as GEMMs, the norms, the gated activation, the residual
add and RoPE as memory-bound kernels, over token counts and tensor-parallel sizes), the
A100's FlashAttention prefill times (``data/profiling/a100/attention.csv`` of commit
e2d00e9: Llama-2-70B's heads at tensor parallel 2), and NCCL times on DGX A100 and DGX
H100 nodes (``data/profiling/network/<gpu>_dgx/{all_reduce,send_recv}.csv``: by ranks,
ranks per node and bytes).  This script keeps the facts STAGE fits (shapes, bytes, the
median time in microseconds) for a subset of the token counts, and names the source in
each file's header.  Nothing of vidur's code is used.

Run: ``python convert_vidur.py VIDUR_CHECKOUT`` (a git checkout; files are read with
``git show`` at the commits named below).
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
COMPUTE_COMMIT = "7d47513"  # vidur main, 2024 (the compute/ and network/ tables)
ATTENTION_COMMIT = "e2d00e9"  # the one attention table stored whole (later ones exceed the mirror's size limit)
#: token counts kept: powers of two and 1.5x, and a few off the power-of-two grid (wave quantization)
TOKENS = sorted({2**i for i in range(16)} | {3 * 2**i for i in range(1, 14)}
                | {40, 200, 1000, 1184, 1696, 2720, 3008, 5056, 10112, 20224})
MODELS = ("Qwen/Qwen-72B", "codellama/CodeLlama-34b-Instruct-hf", "internlm/internlm-20b", "meta-llama/Llama-2-70b-hf",
          "meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-8B", "microsoft/phi-2")
#: message sizes kept: the measured size nearest each power of two and 1.5x from 64 KiB, the smallest a
#: training step moves much of (vidur measures 2 KiB to 64 MiB in steps of 8 KiB and more)
SIZES = sorted({2**i for i in range(16, 27)} | {3 * 2**i for i in range(15, 26)})
KERNEL_HEADER = ["op", "dtype", "batch", "m", "n", "k", "heads", "kv_heads", "head_dim", "seq_q", "seq_k", "causal",
                 "bytes", "us", "name"]


def show(repo: Path, commit: str, path: str) -> list[dict]:
    text = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True,
                          text=True).stdout
    return list(csv.DictReader(io.StringIO(text)))


def us(row: dict, name: str) -> float:
    return round(float(row[f"time_stats.{name}.median"]) * 1e3, 3)  # ms -> us


def mlp_rows(model: str, rows: list[dict]) -> list[list]:
    out = []
    short = model.split("/")[1]
    for r in rows:
        t, tp = int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])
        if t not in TOKENS:
            continue
        h, f, a, kv = int(r["n_embd"]), int(r["n_expanded_embd"]), int(r["n_head"]), int(r["n_kv_head"])
        d, gated = h // a, r["use_gated_mlp"] == "True"
        label = f"{short} tp{tp} {t} tokens"
        gemms = {"attn_pre_proj": (t, (a + 2 * kv) * d // tp, h), "attn_post_proj": (t, h, a * d // tp),
                 "mlp_up_proj": (t, (2 if gated else 1) * f // tp, h), "mlp_down_proj": (t, h, f // tp)}
        for name, (m, n, k) in gemms.items():
            out.append(["gemm", "fp16", 1, m, n, k, "", "", "", "", "", "", "", us(r, name), f"{label} {name}"])
        # memory-bound kernels: bytes read and written (fp16)
        memory = {"input_layernorm": 2 * (2 * t * h + h), "post_attention_layernorm": 2 * (2 * t * h + h),
                  "mlp_act": 2 * (t * (2 if gated else 1) * f // tp + t * f // tp),
                  "attn_rope": 2 * 2 * t * (a + kv) * d // tp}
        if gated:  # the residual add of a block with its post-attention norm: two reads, one write
            memory["add"] = 2 * 3 * t * h
        for name, nbytes in memory.items():
            if not r.get(f"time_stats.{name}.median"):  # not every model has every kernel
                continue
            out.append(["norm" if name.endswith("layernorm") else "memory", "fp16", "", "", "", "", "", "", "", "", "", "", nbytes, us(r, name),
                        f"{label} {name}"])
    return out


def attention_rows(rows: list[dict]) -> list[list]:
    out = []
    for r in rows:
        if r["is_prefill"] != "True" or not r["time_stats.attn_prefill.median"]:
            continue
        chunk, cached = int(r["prefill_chunk_size"]), int(r["kv_cache_size"])
        if cached not in (0, 1024, 2048) or chunk % 64:
            continue
        tp = int(r["num_tensor_parallel_workers"])
        heads, kv = int(r["n_q_head"]) // tp, int(r["n_kv_head"]) // tp
        d = int(r["n_embd"]) // int(r["n_q_head"])
        out.append(["flash_fwd", "fp16", int(r["batch_size"]), "", "", "", heads, kv, d, chunk, cached + chunk, 1, "",
                    us(r, "attn_prefill"), f"Llama-2-70b tp{tp} prefill {chunk} after {cached} cached"])
    return out


def write(path: Path, header: list[str], rows: list[list], sources: list[str]) -> None:
    buf = io.StringIO()
    for line in sources:
        buf.write(f"# {line}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    path.write_text(buf.getvalue())
    print(f"{path.name}: {len(rows)} rows")


def main(repo: Path) -> None:
    for gpu in ("a100", "h100"):
        rows, used = [], []
        for model in MODELS:
            path = f"data/profiling/compute/{gpu}/{model}/mlp.csv"
            try:
                found = show(repo, COMPUTE_COMMIT, path)
            except subprocess.CalledProcessError:
                continue
            rows += mlp_rows(model, found)
            used.append(model.split("/")[1])
        sources = [f"microsoft/vidur (MIT) data/profiling/compute/{gpu}/*/mlp.csv @ {COMPUTE_COMMIT}: "
                   f"{', '.join(used)}",
                   "CUDA kernel time (Kineto), fp16, median; token counts subset; bytes = fp16 reads + writes"]
        write(HERE / f"{gpu}-kernels.csv", KERNEL_HEADER, rows, sources)
    write(HERE / "a100-attention.csv", KERNEL_HEADER,
          attention_rows(show(repo, ATTENTION_COMMIT, "data/profiling/a100/attention.csv")),
          [f"microsoft/vidur (MIT) data/profiling/a100/attention.csv @ {ATTENTION_COMMIT}: FlashAttention prefill "
           "(attn_prefill), causal, Llama-2-70B's heads at tp2 (32 query, 4 KV heads of 128), batch 1; chunks of "
           "64 to 4096 queries after 0, 1024 or 2048 cached keys", "CUDA kernel time (Kineto), fp16, median"])
    for gpu in ("a100", "h100"):
        rows = []
        for coll, op in (("all_reduce", "all_reduce"), ("send_recv", "send")):
            found = show(repo, COMPUTE_COMMIT, f"data/profiling/network/{gpu}_dgx/{coll}.csv")
            measured = sorted({int(r["size"]) for r in found})
            keep = {min(measured, key=lambda m: abs(m - target)) for target in SIZES}
            seen = set()
            for r in found:
                size = int(r["size"])
                n, per = int(r["num_workers"]), int(r["devices_per_node"])
                if size not in keep or (n, per, size) in seen:  # (a size measured twice: the first)
                    continue
                seen.add((n, per, size))
                rows.append([op, n, per, size, us(r, coll), f"{gpu}_dgx nccl {coll} {n} ranks {per} per node"])
        write(HERE / f"{gpu}-collectives.csv", ["op", "ranks", "ranks_per_node", "bytes", "us", "name"], rows,
              [f"microsoft/vidur (MIT) data/profiling/network/{gpu}_dgx/{{all_reduce,send_recv}}.csv @ "
               f"{COMPUTE_COMMIT}", "NCCL kernel time (Kineto), fp16 buffers, median; bytes = the buffer (all-reduce) "
               "or the message (send)"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
