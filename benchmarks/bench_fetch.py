"""Bytes downloaded to add a head from the Hub: ``--fetch ranges`` vs ``--fetch shards`` vs a
plain ``snapshot_download`` vs today's script (hf_hub_download every shard holding an ``mtp.``
tensor, load, extract).

Synthetic repos on the loopback test hub (tests.support.synth.hub_server, 127.0.0.1 only) copy the
real shard layouts of docs/SPEC.md §2 — the head spread over the reported shards, mixed with backbone
tensors — at a reduced width but the real depth, so the head's share of the repo stays close to
the real one. Every tool runs in a child process with its own empty HF_HOME and talks to the
server through the real huggingface_hub client; bytes are what the server log says it sent.
Target: ranges <= 1.01x the head's tensor bytes.

    python benchmarks/bench_fetch.py          # ~3 min
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import common as C

#: name, variant, shards, shards holding the head, config overrides, real (head bytes, repo bytes)
REPOS: list[tuple[str, str, int, list[int], dict[str, Any], tuple[float, float]]] = [
    ("qwen3.5-27b-like", "qwen3_5", 11, [8, 9, 10, 11],
     dict(hidden_size=256, intermediate_size=896, num_hidden_layers=64, num_attention_heads=4, head_dim=64,
          num_key_value_heads=1, vocab_size=8192), (849_398_784, 55.6e9)),
    ("qwen3.6-27b-like", "qwen3_5", 15, [13, 15],
     dict(hidden_size=256, intermediate_size=896, num_hidden_layers=64, num_attention_heads=4, head_dim=64,
          num_key_value_heads=1, vocab_size=8192), (849_398_784, 55.6e9)),
    ("qwen3.6-35b-a3b-like", "qwen3_6_moe", 26, [25, 26],
     dict(hidden_size=128, num_hidden_layers=40, num_experts=32, moe_intermediate_size=64,
          shared_expert_intermediate_size=128, vocab_size=4096), (1.6 * (1 << 30), 71.9e9)),
    ("qwen3-next-80b-like", "qwen3_next", 41, [41],
     dict(hidden_size=128, num_hidden_layers=48, num_experts=32, moe_intermediate_size=64,
          shared_expert_intermediate_size=128, vocab_size=4096), (3.1 * (1 << 30), 162.7e9)),
]

#: A plain full download. snapshot_download lists files with the tree API, which the test hub
#: does not serve; then it does what the fallback does (model_info's file list, hf_hub_download
#: of each file), so the bytes are the same. Prints which path ran.
SNAPSHOT = """
import sys
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
try:
    snapshot_download(sys.argv[1])
    print("snapshot_download")
except Exception as e:
    if "/tree/" not in str(e):
        raise
    info = HfApi().model_info(sys.argv[1])
    for s in info.siblings:
        hf_hub_download(sys.argv[1], s.rfilename, revision=info.sha)
    print("model_info + hf_hub_download of every file")
"""


def build(name: str, variant: str, n_shards: int, mtp_in: list[int], overrides: dict[str, Any]) -> tuple[Path, Path]:
    from tests.support.synth import build_tokenizer, random_hf_tensors, tiny_config, write_hf_checkpoint

    cfg = tiny_config(variant, **overrides)
    tag = f"{name}-{C.folder_fingerprint([cfg, n_shards, mtp_in])}"
    root = C.workdir("fetch")
    src, tgt = root / f"src-{tag}", root / f"tgt-{tag}"
    if not (src / "config.json").is_file():
        tok = root / "tokenizer"
        if not (tok / "tokenizer.json").is_file():
            build_tokenizer(None, 512, tok)  # a real BPE; its size does not matter to a fetch
        write_hf_checkpoint(src, cfg, random_hf_tensors(cfg, seed=3), n_shards=n_shards, mtp_in=mtp_in, tokenizer_dir=tok)
    if not (tgt / "config.json").is_file():
        C.make_mlx_target(cfg, tgt, q_bits=4, tokenizer_from=src)
    return src, tgt


def measured(server: Any, repo: str, cmd: list[str], hf_home: Path) -> tuple[C.Measured, int, int]:
    shutil.rmtree(hf_home, ignore_errors=True)
    hf_home.mkdir(parents=True)
    server.clear_log()
    env = C.child_env(HF_ENDPOINT=server.endpoint, HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1",
                      HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_ENABLE_HF_TRANSFER="0", HF_TOKEN="")
    env.pop("HF_HUB_OFFLINE", None)
    m = C.run_measured(cmd, env=env)
    return m, server.sent_bytes(repo), server.tensor_bytes(repo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="repo names to run (default: all)")
    a = ap.parse_args()
    from tests.support.synth.hub_server import HubServer

    scratch = Path(tempfile.mkdtemp(prefix="mtpforge-bench-fetch-"))
    rows: list[dict[str, Any]] = []
    with HubServer() as server:
        for name, variant, n_shards, mtp_in, overrides, (real_head, real_repo) in REPOS:
            if a.only and name not in a.only:
                continue
            src, tgt = build(name, variant, n_shards, mtp_in, overrides)
            repo = f"bench/{name}"
            server.publish(repo, src)
            head, n_tensors = C.head_bytes(src)
            repo_bytes = sum(f.stat().st_size for f in src.iterdir() if f.is_file())
            row: dict[str, Any] = {"repo": name, "n_shards": n_shards, "head_in_shards": mtp_in, "head_bytes": head,
                                   "head_tensors": n_tensors, "repo_bytes": repo_bytes,
                                   "head_share": head / repo_bytes, "real_head_share": real_head / real_repo}
            for mode in ("ranges", "shards"):
                out = scratch / f"out-{mode}"
                shutil.rmtree(out, ignore_errors=True)
                m, sent, tensor = measured(server, repo, C.mtpforge_cmd(
                    "add-mtp", "--source", repo, "--target", str(tgt), "--output", str(out), "--fetch", mode, "--json"),
                    scratch / "hf")
                rep = m.json()
                row[mode] = {"sent": sent, "tensor_bytes": tensor, "requests": len(server.entries(repo=repo)),
                             "fetched_bytes_reported": rep.get("fetched_bytes"), "fetch_mode": rep.get("fetch_mode"),
                             "wall_s": m.wall_s, "ratio": sent / head, "tensor_ratio": tensor / head}
                shutil.rmtree(out, ignore_errors=True)
            m, sent, tensor = measured(server, repo, [C.PY, "-c", SNAPSHOT, repo], scratch / "hf")
            row["snapshot"] = {"sent": sent, "tensor_bytes": tensor, "wall_s": m.wall_s, "ratio": sent / head,
                               "tensor_ratio": tensor / head, "how": m.stdout.strip()}
            out_file = scratch / "baseline.safetensors"
            m, sent, tensor = measured(server, repo, [C.PY, str(C.HERE / "baseline_extract.py"), "--repo", repo, str(out_file)],
                                       scratch / "hf")
            row["baseline"] = {"sent": sent, "tensor_bytes": tensor, "wall_s": m.wall_s, "ratio": sent / head,
                               "tensor_ratio": tensor / head, "shards": m.json()["shards"]}
            out_file.unlink(missing_ok=True)
            row["ranges_vs_baseline"] = row["ranges"]["sent"] / row["baseline"]["sent"]
            row["shards_vs_baseline"] = row["shards"]["sent"] / row["baseline"]["sent"]
            rows.append(row)
            print(f"  {name}: ranges {row['ranges']['ratio']:.4f}x, shards {row['shards']['ratio']:.1f}x, "
                  f"snapshot {row['snapshot']['ratio']:.1f}x, baseline {row['baseline']['ratio']:.1f}x", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)

    headers = ["repo (shards: head in)", "head KiB", "head share (real)", "ranges x", "ranges data x", "shards x",
               "snapshot x", "baseline x", "ranges/baseline"]
    trows = [[f"{r['repo']} ({r['n_shards']}: {','.join(map(str, r['head_in_shards']))})", r["head_bytes"] / 1024,
              f"{100 * r['head_share']:.2f}% ({100 * r['real_head_share']:.2f}%)", f"{r['ranges']['ratio']:.4f}",
              f"{r['ranges']['tensor_ratio']:.4f}", r["shards"]["ratio"], r["snapshot"]["ratio"], r["baseline"]["ratio"],
              f"{r['ranges_vs_baseline']:.4f}"] for r in rows]
    print()
    print(C.table("Bytes the server sent, as a multiple of the head's tensor bytes (x); 'data' = tensor-data bytes only",
                  headers, trows))
    extra = [[r["repo"], r["ranges"]["requests"], r["ranges"]["sent"] - r["ranges"]["tensor_bytes"],
              r["ranges"]["sent"], r["shards"]["sent"], r["snapshot"]["sent"], r["baseline"]["sent"]] for r in rows]
    print()
    print(C.table("Absolute bytes sent", ["repo", "ranges requests", "ranges non-data bytes", "ranges", "shards",
                                          "snapshot", "baseline"], extra))
    ok = all(r["ranges"]["ratio"] <= 1.01 for r in rows)
    ok_data = all(r["ranges"]["tensor_ratio"] <= 1.01 for r in rows)
    print(f"\ntarget ranges <= 1.01x: {'met' if ok else 'MISSED'} (all bytes); {'met' if ok_data else 'MISSED'} (tensor data)")
    path = C.write_result("fetch", {"rows": rows, "target_met": ok, "target_met_tensor_data": ok_data,
                                    "markdown": C.markdown_table(headers, trows)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
