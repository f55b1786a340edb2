"""Peak memory of ``add-mtp --layout gguf-tail`` against the trunk's size: it must stay flat.

The trunk is llama.cpp's own conversion of the bundled dense model, padded with extra F32
tensors (llama.cpp never loads this file here; only the writer reads it) to 128 MiB, 512 MiB and
2 GiB. Each run is its own child process; we report its peak RSS and that of an idle interpreter
importing the same modules. The trunk's bytes are streamed across in 8 MiB reads, so the
difference must not grow with the trunk.

    python benchmarks/bench_gguf_tail.py            # needs llama.cpp's converter: scripts/setup_llama_cpp.sh
    python benchmarks/bench_gguf_tail.py --quick    # 32 / 128 MiB
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import common as C

sys.path.insert(0, str(C.REPO))

PAD = 8 << 20


def padded_trunk(base: Path, size: int, dst: Path) -> Path:
    import gguf

    from mtpforge.gguf.gguffile import read_local
    from mtpforge.gguf.write import OutTensor, copy_chunks, write_gguf

    if dst.is_file():
        return dst
    g = read_local(base)
    out = [OutTensor(n, t.type, t.shape, t.nbytes, copy_chunks(g, t)) for n, t in g.tensors.items()]
    block = np.random.default_rng(0).standard_normal(PAD // 4).astype(np.float32)
    for i in range(max(0, (size - g.tensor_bytes) // PAD)):
        out.append(OutTensor(f"bench.pad.{i}.weight", gguf.GGMLQuantizationType.F32, (PAD // 4,), PAD,
                             lambda: iter([block.tobytes()])))
    write_gguf(dst, g.arch, g.kv, out)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(C.REPO / "tests"))
    from gguf_env import MODELS, official  # the cached official conversion

    sizes = [32 << 20, 128 << 20] if a.quick else [128 << 20, 512 << 20, 2048 << 20]
    work = C.workdir("gguf-tail")
    base = official(MODELS["dense"], "trunk", "f32")
    idle = C.idle_interpreter(("mtpforge.gguf.addmtp", "mtpforge.pipeline"), env=C.child_env())
    rows, runs = [], []
    for size in sizes:
        trunk = padded_trunk(base, size, work / f"trunk-{size >> 20}MiB.gguf")
        out = work / f"tail-{size >> 20}MiB.gguf"
        out.unlink(missing_ok=True)
        m = C.run_measured(C.mtpforge_cmd("add-mtp", "--source", str(MODELS["dense"]), "--target", str(trunk),
                                          "--layout", "gguf-tail", "--output", str(out), "--json"), env=C.child_env())
        size_b = trunk.stat().st_size
        runs.append({"trunk_bytes": size_b, "peak_rss_bytes": m.maxrss_bytes, "above_idle_bytes": m.maxrss_bytes - idle.maxrss_bytes,
                     "wall_s": round(m.wall_s, 2), "output_bytes": out.stat().st_size})
        rows.append([f"{C.mib(size_b):.0f} MiB", f"{C.mib(m.maxrss_bytes):.0f} MiB",
                     f"{C.mib(m.maxrss_bytes - idle.maxrss_bytes):.0f} MiB", f"{m.wall_s:.1f} s"])
        out.unlink()
    print(C.table("add-mtp --layout gguf-tail: peak RSS by trunk size",
                  ["trunk", "peak RSS", "above idle interpreter", "wall"], rows))
    print(f"idle interpreter: {C.mib(idle.maxrss_bytes):.0f} MiB; {C.drop_file_cache_hint()}")
    path = C.write_result("gguf_tail_memory", {"idle_rss_bytes": idle.maxrss_bytes, "runs": runs})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
