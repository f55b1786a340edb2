"""The real llama.cpp for the GGUF tests: its converter, llama-quantize and llama-server, built by
scripts/setup_llama_cpp.sh into the cache outside the repo.

Official GGUFs (llama.cpp's converter on the bundled models) and quantized trunks are cached in
``$MTPFORGE_CACHE/gguf-official/<hash of the model folder and the tree>/`` so the suite converts
each once. Where llama.cpp is not built, the tests skip (fail under MTPFORGE_CI), naming the
command that builds it (tests/external.py).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import external

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "mtpforge" / "data"
MODELS = {"dense": DATA / "tiny-qwen3_5", "moe": DATA / "tiny-qwen3_5_moe"}
CACHE = Path(os.environ.get("MTPFORGE_CACHE", Path.home() / ".cache" / "mtpforge"))
VERSION = "0.3.36"
TREE = CACHE / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
BIN = TREE / "build" / "bin"
TOOLS_PY = CACHE / "tools-llama-cpp" / "bin" / "python"


def need(what: str) -> None:
    """Skip (fail under MTPFORGE_CI) unless llama.cpp's ``server`` binaries or its ``converter``
    virtualenv are built."""
    ok = {"server": (BIN / "llama-server").is_file() and (BIN / "llama-quantize").is_file(),
          "converter": TOOLS_PY.is_file() and (TREE / "convert_hf_to_gguf.py").is_file()}[what]
    external.require("llama.cpp", ok, f"its {what} is missing under {CACHE}")


def _model_hash(folder: Path) -> str:
    h = hashlib.sha256(str(TREE).encode())
    for p in sorted(folder.iterdir()):
        if p.is_file():
            h.update(p.name.encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def _cached(folder: Path, name: str) -> tuple[Path, bool]:
    d = CACHE / "gguf-official" / f"{folder.name}-{_model_hash(folder)}"
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    return p, p.is_file()


#: model types whose config.json the converter must read as stored: transformers 5.24 maps them to
#: a config class that renames the keys the converter reads (docs/families/step3p5.md §2), or, for
#: MiMo-V2-Flash, fills per-layer-type ``rope_parameters`` that hide the release's
#: ``partial_rotary_factor`` from it (KeyError; docs/families/mimo_v2_flash.md)
RAW_CONFIG_MODEL_TYPES = ("step3p5", "mimo_v2_flash")


def official(folder: Path, mode: str, outtype: str = "f32", pre: str | None = "qwen35") -> Path:
    """llama.cpp's converter on ``folder``: ``trunk`` (--no-mtp), ``mtp`` (--mtp: the MTP-only
    file), ``full`` (trunk with its NextN tail) or ``dspark`` (--dspark: DeepSeek-V4's DSpark
    drafter, the tokenizer from the folder itself)."""
    need("converter")
    p, ok = _cached(folder, f"{mode}-{outtype}.gguf")
    if ok:
        return p
    flag = {"trunk": ["--no-mtp"], "mtp": ["--mtp"], "full": [], "dspark": ["--dspark", "--target-model-dir", str(folder)]}[mode]
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    raw = json.loads((folder / "config.json").read_text()).get("model_type") in RAW_CONFIG_MODEL_TYPES
    rc, log = convert(folder, tmp, outtype, flag, pre=pre, raw_config=raw)
    if rc != 0 or not tmp.is_file():
        raise AssertionError(f"llama.cpp's converter failed on {folder.name} ({mode}, {outtype}): {log[-2000:]}")
    os.replace(tmp, p)
    return p


def convert(folder: Path, outfile: Path, outtype: str, flags: list[str], *, pre: str | None,
            raw_config: bool = False) -> tuple[int, str]:
    """llama.cpp's converter (``scripts/convert_official_gguf.py``) on ``folder``: its exit code
    and output. The suite's conversions run one after another in one converter interpreter per
    test process (``--serve``, Linux), which saves each the ~3 s of importing torch and the
    converter."""
    need("converter")
    args = [str(folder), "--outtype", outtype, "--outfile", str(outfile), *flags]
    if sys.platform == "linux":  # --serve forks a child a conversion: not where fork is unsafe (macOS)
        return _Converter.get().run({"args": args, "pre": pre, "raw_config": raw_config})
    cmd = [str(TOOLS_PY), str(REPO / "scripts" / "convert_official_gguf.py"), "--tree", str(TREE),
           *(["--pre", pre] if pre else []), *(["--raw-config"] if raw_config else []), "--", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    return r.returncode, r.stdout + r.stderr


class _Converter:
    """The one ``convert_official_gguf.py --serve`` process of this test process (started on
    first use, restarted if it died; its stdin closing at exit ends it)."""

    _one: "_Converter | None" = None

    def __init__(self) -> None:
        self.logs = Path(tempfile.mkdtemp(prefix="mtpforge-converter-"))
        atexit.register(shutil.rmtree, self.logs, True)
        self.proc = subprocess.Popen(
            [str(TOOLS_PY), str(REPO / "scripts" / "convert_official_gguf.py"), "--tree", str(TREE), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "NO_COLOR": "1"})
        self.jobs = 0

    @classmethod
    def get(cls) -> "_Converter":
        if cls._one is None or cls._one.proc.poll() is not None:
            cls._one = cls()
        return cls._one

    def run(self, job: dict[str, object], timeout: float = 900) -> tuple[int, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.jobs += 1
        log = self.logs / f"job-{self.jobs}.log"
        self.proc.stdin.write(json.dumps({**job, "log": str(log)}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        text = log.read_text(errors="replace") if log.is_file() else ""
        if not line:  # died or hung: the next conversion starts a fresh one
            self.proc.kill()
            return -1, text + f"\n(the converter process {'hung' if not ready else 'died'}: exit {self.proc.wait()})"
        return int(json.loads(line)["rc"]), text


def quantized(src: Path, qtype: str) -> Path:
    """llama-quantize of an f32 trunk (Q8_0, Q4_K_M, ...), cached beside it."""
    need("server")
    p = src.with_name(src.name.replace("-f32.gguf", f"-{qtype}.gguf"))
    if p.is_file():
        return p
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    r = subprocess.run([str(BIN / "llama-quantize"), str(src), str(tmp), qtype], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"llama-quantize {qtype} failed: {r.stdout[-1500:]} {r.stderr[-1500:]}")
    os.replace(tmp, p)
    return p


def trunk_copy(folder: Path, dst_dir: Path, qtype: str = "f32", name: str | None = None, pre: str | None = "qwen35") -> Path:
    """A private copy of the official trunk (tests may write beside it)."""
    src = official(folder, "trunk", "f32", pre=pre)
    if qtype != "f32":
        src = quantized(src, qtype)
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / (name or f"{folder.name}-{qtype}.gguf")
    shutil.copyfile(src, dst)
    return dst


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def mtpforge(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mtpforge", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}, timeout=timeout)


# ----------------------------------------------------------------------------- llama-server

MAX_TOKENS = 64
#: the tests that start llama-server or its converter run in two groups, each on one pytest-xdist
#: worker, one test at a time: each server is single-threaded (``measure``), so two at once on two
#: cores do not spin against each other, and the worker done first with the rest takes the other
XDIST_GROUP = "llama.cpp"
#: the families added after Qwen, GLM and Nemotron-H: the second group
XDIST_GROUP_FAMILIES = "llama.cpp-families"


def prompts() -> list[str]:
    """verify's 4 default prompts plus 20 held-out documents (a seed no training run used)."""
    from tests.support.synth.tokenizer import default_corpus
    from mtpforge.verify import DEFAULT_PROMPTS

    docs = default_corpus(60, seed=424242)
    extra = [docs[i] + "\n" + docs[i + 1][: max(4, len(docs[i + 1]) // 3)] for i in range(0, 40, 2)]
    return list(DEFAULT_PROMPTS) + extra


def measure(trunk: Path, draft: Path | None = None, mtp: bool = False, texts: list[str] | None = None,
            spec_type: str = "draft-mtp", n_max: int = 1) -> dict:
    """Greedy decoding through llama-server (with ``spec_type`` when a head is given): token ids
    and llama.cpp's own draft counters, summed over the prompts."""
    from mtpforge.gguf.server import decode_all, llama_server

    # one thread: ggml's thread pool spins, and two spinning pools (or one beside the MLX tests of
    # another pytest-xdist worker) on two cores made these runs ~6x slower than alone
    with llama_server(BIN / "llama-server", trunk, draft=draft, mtp=mtp, threads=1, spec_type=spec_type, n_max=n_max) as srv:
        outs = decode_all(srv, texts or prompts(), MAX_TOKENS)
    d, a = sum(c.drafted for c in outs), sum(c.accepted for c in outs)
    return {"tokens": [c.tokens for c in outs], "drafted": d, "accepted": a, "acceptance": a / d if d else 0.0}


def trained_head_runs(model: Path, qtype: str, pre: str, work: Path, mode: str = "trunk") -> tuple[dict, dict, Path]:
    """A trained model's head as add-mtp writes it (the default f16 MTP file) beside a private
    copy of the converter's ``mode`` file of the model at ``qtype``: plain decoding and decoding
    with the head (``measure``), and the trunk."""
    need("server")
    p = official(model, mode, "f32", pre=pre)
    if qtype != "f32":
        p = quantized(p, qtype)
    trunk = Path(shutil.copyfile(p, work / f"trained-{qtype}.gguf"))
    r = mtpforge("add-mtp", "--source", str(model), "--target", str(trunk), "--json")
    assert r.returncode == 0, r.stderr
    return measure(trunk), measure(trunk, draft=Path(json.loads(r.stdout)["output"])), trunk


def trained_head_beside_converters(model: Path, qtype: str, pre: str, work: Path) -> tuple[dict, dict, dict]:
    """``trained_head_runs`` on the converter's ``--no-mtp`` trunk, and the converter's own f16
    ``--mtp`` export beside the same trunk (``graft``): plain, ours, theirs."""
    plain, ours, trunk = trained_head_runs(model, qtype, pre, work)
    theirs = measure(trunk, draft=graft(official(model, "mtp", "f16", pre=pre), trunk, work / "official" / "mtp-official.gguf"))
    return plain, ours, theirs


def graft(official_mtp: Path, trunk: Path, dst: Path) -> Path:
    """The official MTP block beside the trunk's own token_embd/output_norm/output: gguf-py
    writes the official file's metadata and MTP tensors with the trunk's three in place of its
    f32 copies."""
    from mtpforge.gguf.gguffile import read_local
    from mtpforge.gguf.names import SHARED_TENSORS
    from mtpforge.gguf.write import OutTensor, copy_chunks, write_gguf

    off, tr = read_local(official_mtp), read_local(trunk)
    out = [OutTensor(n, t.type, t.shape, t.nbytes, copy_chunks(tr, t)) for n, t in tr.tensors.items() if n in SHARED_TENSORS]
    out += [OutTensor(n, t.type, t.shape, t.nbytes, copy_chunks(off, t)) for n, t in off.tensors.items() if n not in SHARED_TENSORS]
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(dst, off.arch, off.kv, out)
    return dst
