"""A DeepSeek-V3-sized head from the (loopback) Hub into a GGUF sibling and an MLX sidecar.

The source is written by this script, tensor by tensor: DeepSeek-V3's NextN layer at full width
(hidden 7168, MLA with q_lora 1536 / kv_lora 512 and 128 heads, ``--experts`` routed experts of
7168x2048 plus one shared expert, ``eh_proj``), its projections block-FP8 (F8_E4M3 with a 128x128
``weight_scale_inv``) as the release stores them; 256 experts (the release) is about 11.6 GB.
Beside it a one-layer backbone (dense MLP, small vocabulary), whose tensors share the shards with
the head's, so a fetch has to pick the head's bytes out of shards that hold others. The head's
``embed_tokens`` / ``shared_head.head`` copies are vocabulary-sized and the vocabulary is small
(the trunk's copies are what the outputs use), so "head bytes" is the layer's other tensors.

Targets: a head-less GGUF trunk (tests.support.synth.gguf_trunk: what add-mtp reads of a
``deepseek2`` trunk) and a one-layer 4-bit MLX folder written with mlx-lm's own model class, both
with the head's dimensions. Each run is ``add-mtp --source <repo id> --fetch ranges`` (``--fetch stream`` with that option) against the
loopback hub (tests.support.synth.hub_server, real huggingface_hub client over HTTP, an empty
HF_HOME), in its own child process: GGUF f16, GGUF q8_0, MLX sidecar (bf16, the default for a MoE
head). Measured: bytes the server sent / head bytes (target <= 1.01), peak RSS above an idle
interpreter / head bytes (<= 0.25, flat in expert count), wall time / (cp + fsync of the bytes
written) (<= 1.3), and wall time against the run's I/O floor: cp + fsync of the output
and of the download the run keeps in the Hub cache (a run from the Hub writes both; the target's
cp + fsync counts the output only). Before each run the source is read once into memory, so that
the loopback server sends it from there, as a remote Hub's bytes never touch this disk
(``--cold-source``: the server reads the disk the run writes). Outputs are deleted after each
run; the source is kept for reuse.

    python benchmarks/bench_giant.py --experts 16 64      # scaling series (~12 min; --local: ~20 min)
    python benchmarks/bench_giant.py                      # 256 experts: ~12.3 GB source, 25 GB f16 output,
                                                          # ~60 GB of free disk at the peak, ~30 min here
    python benchmarks/bench_giant.py --quick              # small width, for development
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import common as C

#: DeepSeek-V3 / V3.2's head dimensions (the release's config.json)
FULL = dict(hidden_size=7168, moe_intermediate_size=2048, q_lora_rank=1536, kv_lora_rank=512, num_attention_heads=128,
            num_key_value_heads=128, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
QUICK = dict(hidden_size=512, moe_intermediate_size=256, q_lora_rank=256, kv_lora_rank=128, num_attention_heads=8,
             num_key_value_heads=8, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64)
BLOCK = 128


def giant_config(experts: int, dims: dict[str, int], vocab: int, intermediate: int) -> dict[str, Any]:
    from tests.support.synth.deepseek_v3 import FP8_CONFIG, tiny_config

    return tiny_config(**dims, n_routed_experts=experts, n_group=min(8, experts), topk_group=min(4, experts),
                       num_experts_per_tok=8, num_hidden_layers=1, first_k_dense_replace=1,
                       intermediate_size=intermediate, vocab_size=vocab, quantization_config=dict(FP8_CONFIG))


def head_prefix(config: dict[str, Any]) -> str:
    return f"model.layers.{config['num_hidden_layers']}."


def fp8_predicate(config: dict[str, Any]) -> Callable[[str], bool]:
    """The release's FP8 tensors of the NextN layer (tests.support.synth.deepseek_v3.to_fp8_release)."""
    from tests.support.synth.deepseek_v3 import FP8_KEEP

    p = head_prefix(config)
    keep = {p + k for k in FP8_KEEP}
    return lambda name: name.startswith(p) and name not in keep and not name.endswith("mlp.gate.weight")


class _Fp8Pool:
    """FP8 codes of N(0, 1) x 64 (finite, every exponent), windows as common._Pool's."""

    def __init__(self, n: int = 1 << 23) -> None:
        import mlx.core as mx
        import numpy as np

        a = mx.random.normal((n,), key=mx.random.key(7)) * 64
        self.raw = np.array(mx.to_fp8(a), dtype=np.uint8).tobytes()
        self.raw2 = self.raw * 2

    def take(self, name: str, nbytes: int):
        n = len(self.raw)
        off = zlib.crc32(name.encode()) % n
        while nbytes > 0:
            k = min(nbytes, n)
            yield self.raw2[off: off + k]
            nbytes -= k


def _small(name: str, shape: tuple[int, ...], loc: float, scale: float, dtype: str) -> bytes:
    import numpy as np

    rng = np.random.default_rng(zlib.crc32(name.encode()))
    a = (rng.standard_normal(shape, dtype=np.float32) * scale + loc).astype(np.float32)
    if dtype == "F32":
        return a.tobytes()
    return ((a.view(np.uint32) + 0x8000) >> 16).astype("<u2").tobytes()


def build_source(experts: int, dims: dict[str, int], vocab: int, intermediate: int, n_shards: int) -> tuple[Path, dict[str, Any]]:
    """The FP8 source, streamed to disk (one tensor in memory at most), cached by config."""
    from tests.support.synth.deepseek_v3 import DEEPSEEK_SPECIAL, TRAINED_VOCAB
    from tests.support.synth.family_common import build_family_tokenizer, write_generation_config
    from tests.support.synth.glm4_moe_lite import tensor_specs
    from tests.support.synth.write import natural_key, shard_name
    from mtpforge.writer.safetensors_stream import SafetensorsWriter, TensorSpec

    cfg = giant_config(experts, dims, vocab, intermediate)
    folder = C.workdir("giant") / f"src-e{experts}-h{dims['hidden_size']}-{C.folder_fingerprint([cfg, n_shards])}"
    if (folder / "config.json").is_file():
        return folder, cfg
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    specs = tensor_specs(cfg, nextn=True)
    is_fp8 = fp8_predicate(cfg)
    p = head_prefix(cfg)
    # (name, dtype, shape) in file order: scale_inv right after its tensor
    order: list[tuple[str, str, tuple[int, ...]]] = []
    for k in sorted(specs, key=natural_key):
        shape = tuple(specs[k][0])
        if is_fp8(k) and len(shape) == 2:
            order.append((k, "F8_E4M3", shape))
            order.append((k + "_scale_inv", "F32", (-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))))
        else:
            order.append((k, "F32" if k.endswith("e_score_correction_bias") else "BF16", shape))
    # the head's tensors over the last n_shards - 1 shards by bytes, the backbone's large tensors
    # dealt into the same shards (and the first one), as a release mixes them
    nbytes = {k: int(math.prod(s) * {"F8_E4M3": 1, "BF16": 2, "F32": 4}[d]) for k, d, s in order}
    head = [t for t in order if t[0].startswith(p)]
    back = [t for t in order if not t[0].startswith(p)]
    per = sum(nbytes[t[0]] for t in head) / max(1, n_shards - 1)
    shard_of: dict[str, int] = {}
    acc = 0
    for t in head:
        shard_of[t[0]] = 1 + min(n_shards - 2, int(acc // per)) if n_shards > 1 else 0
        acc += nbytes[t[0]]
    big = sorted((t for t in back if nbytes[t[0]] >= 1 << 20), key=lambda t: natural_key(t[0]))
    for t in back:
        shard_of[t[0]] = 0
    for i, t in enumerate(big):
        shard_of[t[0]] = i % n_shards
    bf16_pool, fp8_pool = C._Pool(), _Fp8Pool()
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(n_shards):
        names = [t for t in order if shard_of[t[0]] == s]
        fname = shard_name(s, n_shards)
        tspecs = [TensorSpec(k, d, list(shape)) for k, d, shape in names]
        with SafetensorsWriter(folder / fname, tspecs, {"format": "pt"}) as w:
            for t in tspecs:
                n = t.nbytes
                base = t.key[: -len("_scale_inv")] if t.key.endswith("_scale_inv") else t.key
                if t.dtype == "F8_E4M3":
                    w.write(t.key, b"".join(fp8_pool.take(t.key, n)))
                elif t.key.endswith("_scale_inv"):  # one scale per block: about 0.02 / 64
                    w.write(t.key, _small(t.key, tuple(t.shape), 3e-4, 3e-5, "F32"))
                elif n >= 1 << 21 and t.dtype == "BF16":
                    w.write(t.key, b"".join(bf16_pool.take(t.key, n)))
                else:
                    _, _, loc, scale = specs[base]
                    w.write(t.key, _small(t.key, tuple(t.shape), loc, scale, t.dtype))
                weight_map[t.key] = fname
                total += n
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        build_family_tokenizer(Path(tmp), min(TRAINED_VOCAB, vocab - len(DEEPSEEK_SPECIAL)), DEEPSEEK_SPECIAL,
                               eos=DEEPSEEK_SPECIAL[1], bos=DEEPSEEK_SPECIAL[0])
        for f in Path(tmp).iterdir():
            if f.is_file() and f.name != "config.json":
                shutil.copyfile(f, folder / f.name)
    write_generation_config(folder, cfg)
    return folder, cfg


def build_targets(src: Path, cfg: dict[str, Any]) -> tuple[Path, Path]:
    """A head-less GGUF trunk and a 4-bit one-layer MLX folder with the head's dimensions."""
    import copy

    import mlx.core as mx
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    from tests.support.synth.gguf_trunk import synthetic_trunk

    root = src.parent / f"targets-{src.name}"
    gguf, mlx = root / "DeepSeek-V3-like-F32.gguf", root / "mlx-4bit"
    if not gguf.is_file():
        synthetic_trunk(src, gguf, name="DeepSeek-V3-like")
    if not (mlx / "config.json").is_file():
        c = copy.deepcopy({k: v for k, v in cfg.items() if k != "quantization_config"})
        model_class, args_class = _get_classes(c)
        model = model_class(args_class.from_dict(c))
        model.set_dtype(mx.bfloat16)
        mx.eval(model.parameters())
        model, c = quantize_model(model, c, 64, 4)
        shutil.rmtree(mlx, ignore_errors=True)
        mlx.mkdir(parents=True)
        save_model(mlx, model)
        save_config(c, mlx / "config.json")
        for f in src.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "generation_config")):
                shutil.copyfile(f, mlx / f.name)
    return gguf, mlx


def layer_bytes(src: Path, cfg: dict[str, Any]) -> tuple[int, int, int]:
    """(bytes, tensors, FP8 bytes) of the whole NextN layer."""
    from mtpforge.checkpoint.catalogue import load_catalogue
    from mtpforge.checkpoint.store import LocalStore

    p = head_prefix(cfg)
    cat = load_catalogue(LocalStore(src))
    infos = [i for k, i in cat.tensors.items() if k.startswith(p)]
    return sum(i.nbytes for i in infos), len(infos), sum(i.nbytes for i in infos if i.dtype == "F8_E4M3")


def out_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def cp_fsync(path: Path) -> C.Measured:
    """cp (a real byte copy) of the output, then fsync of every file copied: what add-mtp's
    writer does before its rename. The output was written past the page cache, so cp reads it
    from the disk (on this machine the figure moved 19.9-37 s for the same 23.6 GB over a day:
    compare a run with the cp + fsync measured beside it)."""
    dst = path.with_name(path.name + ".cp")
    shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(missing_ok=True)
    cmd = ["cp", "-r", *(["--reflink=never"] if sys.platform.startswith("linux") else []), str(path), str(dst)]
    code = ("import os, subprocess, sys; from pathlib import Path; subprocess.run(sys.argv[2:], check=True); d = Path(sys.argv[1])\n"
            "for f in ([d] if d.is_file() else [x for x in d.rglob('*') if x.is_file()]):\n"
            "    fd = os.open(f, os.O_RDONLY); os.fsync(fd); os.close(fd)\n")
    C.settle_disk()
    m = C.run_measured([C.PY, "-S", "-c", code, str(dst), *cmd])
    shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(missing_ok=True)
    return m


RUNS = (("gguf", "f16"), ("gguf", "q8_0"), ("mlx", "bf16"))


def tensors_read(server: Any, repo: str, prefix: str) -> tuple[dict[str, int], list[str]]:
    """The NextN tensors (name -> bytes) whose data the server sent, from its log and the shards'
    headers, and any other tensors it sent data of: the denominator of the fetched ratio is what
    this output is made of (the GGUF block keeps the layer's ``embed_tokens`` copy, MTPLX's
    sidecar uses the trunk's)."""
    from mtpforge.checkpoint.safetensors_header import read_local_header

    root = server.repos[repo].commits[server.repos[repo].refs["main"]].root
    headers: dict[str, Any] = {}
    read: dict[str, int] = {}
    others: set[str] = set()
    for e in server.entries(repo=repo):
        if not (e.file or "").endswith(".safetensors") or not e.tensor_bytes:
            continue
        m = re.match(r"bytes=(\d+)-", e.range or "")
        a = int(m.group(1)) if m else 0
        b = a + e.sent
        h = headers.get(e.file) or headers.setdefault(e.file, read_local_header(root / e.file, e.file))
        for k, info in h.tensors.items():
            if info.begin < b and info.end > a and info.end > info.begin:
                if k.startswith(prefix):
                    read[k] = info.nbytes
                else:
                    others.add(k)
    return read, sorted(others)


def warm(src: Path) -> float:
    """Read the source's files once, so that the loopback server sends them from memory: the
    Hub's server reads its own disks, not the user's, and a loopback server reading this disk
    took a giant head's run's disk time (the cp + fsync steps between runs evict the source)."""
    t0 = time.perf_counter()
    buf = bytearray(8 << 20)
    for f in sorted(src.rglob("*")):
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
    return time.perf_counter() - t0


def run_one(server: Any, repo: str, fmt: str, precision: str, target: Path, scratch: Path, prefix: str,
            src: Path | None = None, fetch: str = "ranges") -> dict[str, Any]:
    """One add-mtp from the loopback hub; ``src`` (the served folder) read into memory first
    (``warm``) unless None (``--cold-source``: the server reads this disk as the run writes it)."""
    out = scratch / (f"out-{precision}.gguf" if fmt == "gguf" else f"out-mlx-{precision}")
    for x in (out, out.with_name(out.name + ".mtpforge.json")):
        shutil.rmtree(x, ignore_errors=True) if x.is_dir() else x.unlink(missing_ok=True)
    hf = scratch / "hf"
    shutil.rmtree(hf, ignore_errors=True)
    hf.mkdir(parents=True)
    server.clear_log()
    env = C.child_env(HF_ENDPOINT=server.endpoint, HF_HOME=str(hf), HF_HUB_DISABLE_TELEMETRY="1",
                      HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_ENABLE_HF_TRANSFER="0", HF_TOKEN="")
    env.pop("HF_HUB_OFFLINE", None)
    warm_s = warm(src) if src is not None else None
    C.settle_disk()
    m = C.run_measured(C.mtpforge_cmd("add-mtp", "--source", repo, "--target", str(target), "--output", str(out),
                                      "--precision", precision, "--fetch", fetch, "--json"), env=env)
    rep = m.json()
    written = out_bytes(out)
    sent, tensor = server.sent_bytes(repo), server.tensor_bytes(repo)
    read, others = tensors_read(server, repo, prefix)
    cache = out_bytes(hf)
    kept = cp_fsync(hf)  # the download the run keeps in the Hub cache: bytes it must write too
    shutil.rmtree(hf, ignore_errors=True)
    cp = cp_fsync(out)
    for x in (out, out.with_name(out.name + ".mtpforge.json")):
        shutil.rmtree(x, ignore_errors=True) if x.is_dir() else x.unlink(missing_ok=True)
    return {"format": fmt, "precision": precision, "wall_s": m.wall_s, "cpu_s": m.cpu_s, "peak_rss": m.maxrss_bytes,
            "sent": sent, "tensor_bytes": tensor, "written_bytes": written, "hf_home_bytes": cache,
            "cp_fsync_s": cp.wall_s, "cache_cp_fsync_s": kept.wall_s, "io_floor_s": kept.wall_s + cp.wall_s, "head_bytes": sum(read.values()), "head_tensors": len(read), "other_tensors_read": others, "mtp_bytes": rep.get("mtp_bytes"), "fetched_bytes_reported": rep.get("fetched_bytes"),
            "fetch": fetch, "fetch_mode": rep.get("fetch_mode"), "layout": rep.get("layout"),
            "server_source": "memory" if src is not None else "disk", "warm_s": warm_s}


def run_local(src: Path, fmt: str, precision: str, target: Path, scratch: Path) -> dict[str, Any]:
    """The same conversion from the source folder (no hub, warm cache): the conversion's share."""
    out = scratch / (f"local-{precision}.gguf" if fmt == "gguf" else f"local-mlx-{precision}")
    shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink(missing_ok=True)
    C.settle_disk()
    m = C.run_measured(C.mtpforge_cmd("add-mtp", "--source", str(src), "--target", str(target), "--output", str(out),
                                      "--precision", precision, "--json"), env=C.child_env())
    for x in (out, out.with_name(out.name + ".mtpforge.json")):
        shutil.rmtree(x, ignore_errors=True) if x.is_dir() else x.unlink(missing_ok=True)
    return {"local_wall_s": m.wall_s, "local_cpu_s": m.cpu_s, "local_peak_rss": m.maxrss_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, nargs="+", default=[256])
    ap.add_argument("--quick", action="store_true", help="small width (hidden 512), for development")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=4096, help="the backbone's dense MLP width")
    ap.add_argument("--shards", type=int, default=5)
    ap.add_argument("--only", nargs="*", choices=[f"{f}-{p}" for f, p in RUNS], help="runs (default: all)")
    ap.add_argument("--local", action="store_true", help="also convert from the source folder (no hub): fetch vs conversion")
    ap.add_argument("--link", type=float, default=None, metavar="MB/S",
                    help="pace the hub's answers to this many MB a second (a real link; default: loopback speed)")
    ap.add_argument("--keep-source", action="store_true", help="keep the generated source (default: delete it after)")
    ap.add_argument("--cold-source", action="store_true",
                    help="let the loopback server read the source from this disk during the run (default: read into "
                         "memory first, as a remote Hub's bytes are not on this disk)")
    ap.add_argument("--fetch", choices=["ranges", "stream"], default="ranges",
                    help="add-mtp's --fetch: ranges keeps the download in the Hub cache (the I/O floor counts its "
                         "cp + fsync), stream holds it in memory until converted")
    ap.add_argument("--name", default=None, help="result file name (default: giant, or giant-quick)")
    a = ap.parse_args()
    dims = QUICK if a.quick else FULL
    from tests.support.synth.hub_server import HubServer

    idle = [C.idle_interpreter(env=C.child_env()).maxrss_bytes for _ in range(3)]
    idle_rss = sorted(idle)[1]
    print(f"idle interpreter: {C.mib(idle_rss):.0f} MiB; free disk {shutil.disk_usage(C.workdir('giant')).free / 1e9:.1f} GB", flush=True)
    rows: list[dict[str, Any]] = []
    scratch = C.workdir("giant") / "scratch"
    with HubServer(rate=a.link * 1e6 if a.link else None) as server:
        for E in a.experts:
            t0 = time.perf_counter()
            src, cfg = build_source(E, dims, a.vocab, a.intermediate, a.shards)
            gguf, mlx = build_targets(src, cfg)
            build_s = time.perf_counter() - t0
            layer, n_tensors, fp8 = layer_bytes(src, cfg)
            repo_bytes = out_bytes(src)
            repo = f"bench/deepseek-v3-like-e{E}"
            t0 = time.perf_counter()
            server.publish(repo, src)
            publish_s = time.perf_counter() - t0
            print(f"E={E}: NextN layer {layer / 1e9:.3f} GB ({n_tensors} tensors, FP8 {fp8 / 1e9:.3f} GB) in a {repo_bytes / 1e9:.3f} GB repo; "
                  f"built in {build_s:.0f} s, published in {publish_s:.0f} s", flush=True)
            for fmt, precision in RUNS:
                if a.only and f"{fmt}-{precision}" not in a.only:
                    continue
                r = run_one(server, repo, fmt, precision, gguf if fmt == "gguf" else mlx, scratch, head_prefix(cfg),
                            None if a.cold_source else src, a.fetch)
                head = r["head_bytes"]
                r.update(experts=E, layer_bytes=layer, repo_bytes=repo_bytes, idle_rss=idle_rss,
                         fetched_ratio=r["sent"] / head, fetched_data_ratio=r["tensor_bytes"] / head,
                         rss_delta=r["peak_rss"] - idle_rss, wall_vs_cp_fsync=r["wall_s"] / r["cp_fsync_s"],
                         wall_vs_io_floor=r["wall_s"] / r["io_floor_s"])
                r["rss_ratio"] = r["rss_delta"] / head
                if a.local:
                    r.update(run_local(src, fmt, precision, gguf if fmt == "gguf" else mlx, scratch))
                    r["local_vs_cp_fsync"] = r["local_wall_s"] / r["cp_fsync_s"]
                rows.append(r)
                print(f"  {fmt} {precision}: fetched {r['fetched_ratio']:.4f}x, +{C.mib(r['rss_delta']):.0f} MiB "
                      f"({r['rss_ratio']:.4f}x), {r['wall_s']:.1f} s vs cp+fsync {r['cp_fsync_s']:.1f} s of "
                      f"{r['written_bytes'] / 1e9:.2f} GB ({r['wall_vs_cp_fsync']:.2f}x; {r['wall_vs_io_floor']:.2f}x with the "
                      f"cache's {r['cache_cp_fsync_s']:.1f} s), cpu {r['cpu_s']:.0f} s"
                      + (f"; from the folder {r['local_wall_s']:.1f} s ({r['local_vs_cp_fsync']:.2f}x), cpu {r['local_cpu_s']:.0f} s"
                         if a.local else ""), flush=True)
            if not a.keep_source:
                shutil.rmtree(src.parent / f"targets-{src.name}", ignore_errors=True)
                shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)

    headers = ["experts", "output", "head GB", "written GB", "fetched x", "fetched data x", "+RSS MiB", "RSS / head",
               "add-mtp s", "cp+fsync s", "wall / (cp+fsync)", "cache cp+fsync s", "wall / I/O floor"]
    trows = [[r["experts"], f"{r['format']} {r['precision']}", r["head_bytes"] / 1e9, r["written_bytes"] / 1e9,
              f"{r['fetched_ratio']:.4f}", f"{r['fetched_data_ratio']:.4f}", C.mib(r["rss_delta"]), f"{r['rss_ratio']:.4f}",
              r["wall_s"], r["cp_fsync_s"], r["wall_vs_cp_fsync"], r["cache_cp_fsync_s"], r["wall_vs_io_floor"]] for r in rows]
    if a.local:
        headers += ["from folder s", "folder / (cp+fsync)"]
        for t, r in zip(trows, rows):
            t += [r["local_wall_s"], r["local_vs_cp_fsync"]]
    print()
    print(C.table(f"DeepSeek-V3-like FP8 head over the loopback hub (--fetch {a.fetch}); RSS above an idle interpreter "
                  f"({C.mib(idle_rss):.0f} MiB)", headers, trows))
    ok = {"fetched <= 1.01": all(r["fetched_ratio"] <= 1.01 for r in rows),
          "rss <= 0.25": all(r["rss_ratio"] <= 0.25 for r in rows),
          "wall <= 1.3 cp+fsync": all(r["wall_vs_cp_fsync"] <= 1.3 for r in rows)}
    print("\n" + "; ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in ok.items()))
    path = C.write_result(a.name or ("giant-quick" if a.quick else "giant"), {
        "dims": dims, "fetch": a.fetch, "link_mb_s": a.link, "vocab": a.vocab, "intermediate": a.intermediate, "shards": a.shards, "idle_rss_bytes": idle_rss,
        "idle_samples": idle, "rows": rows, "targets": ok, "markdown": C.markdown_table(headers, trows)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
