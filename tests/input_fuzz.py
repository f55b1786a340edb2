"""Mutate every value of every file mtpforge reads, run the command that reads it, and judge.

One engine for ``tests/test_inputs.py`` (a few hundred hypothesis examples in the suite) and
``scripts/fuzz_inputs.py`` (thousands per file kind, counted). Each example copies small
checkpoints built once per session into a fresh case folder, changes one thing in one file — a
value's type, range, shape or nesting, a key removed or added, or the whole file's encoding —
runs one real command through the CLI in this process (typer's runner: the same ``run_command``
and error rendering as ``python -m mtpforge``), and checks the contract (docs/CONTRACT.md):

- exit 0, 1 or 2; never a traceback, never "internal error";
- a non-zero exit that is not a report (inspect's findings, a failed check) is one line
  ``error: … — fix: …`` with a fix, and the JSON error object has code, message and fix;
- nothing written: the case folder is byte for byte as before after a read-only command, and
  after any command that did not succeed (``run`` may have written before its check failed:
  its report says so).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gguf
import yaml
from hypothesis import strategies as st

from tests.checkers import CliTimeout, cli_in_process, folder_state

KINDS = ("config", "index", "header", "manifest", "recipe", "gguf", "fp8", "generation_config", "tokenizer_config")
SHARD_SRC = "model-00002-of-00003.safetensors"
TIMEOUT_S = 90


# ----------------------------------------------------------------------------- the checkpoints


@dataclass
class Bench:
    """Checkpoints built once: every case starts from copies of these."""

    root: Path
    hf: Path  # raw Hugging Face source (qwen3_5)
    mlx: Path  # its mlx_lm conversion, no head
    sidecar: Path  # after plain add-mtp (sidecar, card, manifest)
    embedded: Path  # after add-mtp --layout embedded (the index names the head)
    fp8: Path  # the source as a block-FP8 release
    gguf: Path  # a folder with a GGUF trunk (F32)
    gguf_head: Path  # the same with the MTP-only file add-mtp wrote beside it, and its card
    n: int = 0
    #: leave out the one command that decodes for seconds (inspect deciding norms by behaviour
    #: when a mutated record no longer vouches for them): the suite's examples stay quick
    fast: bool = False


def make_bench(root: Path) -> Bench:
    from mtpforge.pipeline import add_mtp
    from tests.support.synth import build_hf_variant, convert_to_mlx
    from tests.support.synth.fp8 import to_block_fp8
    from tests.support.synth.gguf_trunk import synthetic_trunk

    root.mkdir(parents=True, exist_ok=True)
    hf = build_hf_variant("qwen3_5", root / "hf")
    mlx = convert_to_mlx(hf, root / "mlx", q_bits=4, q_group_size=64, dtype="bfloat16")
    sidecar, embedded = root / "sidecar", root / "embedded"
    shutil.copytree(mlx, sidecar)
    shutil.copytree(mlx, embedded)
    add_mtp(source=str(hf), target=str(sidecar), progress=False)
    add_mtp(source=str(hf), target=str(embedded), layout="embedded", progress=False)
    fp8 = to_block_fp8(hf, root / "fp8")
    g = root / "gguf"
    synthetic_trunk(hf, g / "Tiny-Qwen3_5-F32.gguf")
    gh = root / "gguf-head"
    shutil.copytree(g, gh)
    from mtpforge.gguf.addmtp import add_mtp_gguf

    add_mtp_gguf(source=str(hf), target=str(gh / "Tiny-Qwen3_5-F32.gguf"), progress=False)
    return Bench(root, hf, mlx, sidecar, embedded, fp8, g, gh)


# ----------------------------------------------------------------------------- values

_SPECIAL_INTS = [0, -1, 1, 2, 3, 4, 7, 8, 16, 32, 64, 100, 127, 128, 255, 2**16, 2**31 - 1, 2**31, 2**32, 2**53 + 1,
                 2**63 - 1, 2**63, 2**64, 10**15, -(2**63)]
_SPECIAL_STRS = ["", " ", "4", "8", "x", "affine", "mxfp4", "bogus", "bfloat16", "float16", "F8_E4M3", "BF16", "I64",
                 "../x", "/etc/passwd", "model.safetensors", "mtp.safetensors", "\u00ff\u00fe", "\x00", "a" * 300,
                 "language_model.mtp.fc", "NaN", "true", "null", "{}", "\ud800x"]
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.sampled_from(_SPECIAL_INTS), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0.0, -0.0, 0.5, 4.0, 1e308, -1e308, 1e-320, float("nan"), float("inf"), float("-inf")]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(_SPECIAL_STRS), st.text(max_size=12),
)
VALUES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                      max_leaves=6)

#: whole-file damage, for any text file (JSON or YAML)
FILE_OPS = ("empty", "truncated", "not-json", "utf16", "bom", "latin1", "nul", "deep", "top-list", "top-string",
            "nan-literal", "duplicate-keys")


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in a JSON document (containers included, the root excluded)."""
    out: list[tuple[Any, ...]] = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    for k, v in items:
        out.append(prefix + (k,))
        if len(out) < 5000:
            out += _paths(v, prefix + (k,))
    return out


def _tweaks(v: Any) -> list[Any]:
    """Nearby values of the same kind: the mutations a plausible bug or hand edit makes."""
    if isinstance(v, bool):
        return [not v, int(v), str(v).lower()]
    if isinstance(v, int):
        return [v - 1, v + 1, -v, v * 2, v // 2, 0, v + 2**32, float(v), str(v), [v]]
    if isinstance(v, float):
        return [-v, v * 1e300, int(v) if v == v and abs(v) < 1e18 else 0, str(v), float("nan")]
    if isinstance(v, str):
        return ["", v + "x", v.upper(), v[::-1], v * 3, v.encode("utf-8", "surrogatepass").hex(), [v], None]
    if isinstance(v, list):
        return [[], v[1:], v + v[:1], v[::-1], [v], {"0": v[0]} if v else {}, len(v)]
    if isinstance(v, dict):
        keys = list(v)
        return [{}, {k: v[k] for k in keys[1:]}, [v], list(v.values()), {**v, "": None}]
    return [0, "", [], {}]


def _set(doc: Any, path: tuple[Any, ...], value: Any, op: str) -> None:
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    k = path[-1]
    if op == "delete":
        del parent[k]
    elif op == "add" and isinstance(parent[k], dict):
        parent[k]["mtpforge_fuzz_" + str(len(parent[k]))] = value
    elif op == "add" and isinstance(parent[k], list):
        parent[k].append(value)
    else:
        parent[k] = value


def mutate_doc(data: Any, doc: Any, label: str) -> tuple[Any, str]:
    """One change to a parsed JSON (or YAML) document; returns it and what was done."""
    paths = _paths(doc)
    if not paths:
        return data.draw(VALUES, label=f"{label}: whole"), "whole document replaced"
    path = data.draw(st.sampled_from(paths), label=f"{label}: path")
    op = data.draw(st.sampled_from(["replace", "replace", "tweak", "tweak", "delete", "add"]), label=f"{label}: op")
    cur = doc
    for p in path:
        cur = cur[p]
    if op == "tweak":
        value = data.draw(st.sampled_from(_tweaks(cur)), label=f"{label}: tweak")
    elif op == "delete":
        value = None
    else:
        value = data.draw(VALUES, label=f"{label}: value")
    _set(doc, path, value, op)
    return doc, f"{op} {'.'.join(map(str, path))} -> {str(value)[:60]!r}"


def damaged_text(text: bytes, op: str) -> bytes:
    return {
        "empty": b"",
        "truncated": text[: max(0, len(text) // 2)],
        "not-json": b"{this is: not json" + text[:20],
        "utf16": text.decode("utf-8", "replace").encode("utf-16"),
        "bom": b"\xef\xbb\xbf" + text,
        "latin1": text.replace(b'"', b'"\xff', 1),
        "nul": text[:10] + b"\x00" + text[10:],
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "top-list": b"[" + text + b"]",
        "top-string": json.dumps(text.decode("utf-8", "replace")).encode(),
        "nan-literal": text.replace(b"1", b"NaN", 1) if b"1" in text else b"NaN",
        "duplicate-keys": text.replace(b"{", b'{"model_type": 1, ', 1) if text.startswith(b"{") else text + text,
    }[op]


def mutate_json_file(data: Any, path: Path, label: str) -> str:
    """Change one value of a JSON file (or damage the whole file)."""
    raw = path.read_bytes()
    if data.draw(st.integers(0, 9), label=f"{label}: file-level?") == 0:
        op = data.draw(st.sampled_from(FILE_OPS), label=f"{label}: file op")
        _replace(path, damaged_text(raw, op))
        return f"file {op}"
    doc, what = mutate_doc(data, json.loads(raw), label)
    _replace(path, json.dumps(doc, allow_nan=True, ensure_ascii=data.draw(st.booleans(), label="ascii")).encode("utf-8", "surrogatepass"))
    return what


def _replace(path: Path, data: bytes) -> None:
    """A new inode (the case folders were copied: nothing shares the session's originals)."""
    tmp = path.with_name(path.name + ".fuzz-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- file kinds


@dataclass
class Case:
    root: Path
    argv: list[str]
    what: str
    #: commands that never write, whatever they exit with
    read_only: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _mlx_case(bench: Bench, root: Path, data: Any, *, need_head: bool = False) -> tuple[Path, Path, str]:
    """A source and a target copied into the case; the target with or without a head."""
    base = data.draw(st.sampled_from(["sidecar", "embedded"] + ([] if need_head else ["mlx"])), label="target")
    src = _copy(bench.hf, root / "src")
    tgt = _copy(getattr(bench, base), root / "tgt")
    return src, tgt, base


def _commands_mlx(src: Path, tgt: Path, base: str) -> list[tuple[list[str], bool]]:
    """(argv, read-only) of the commands that read an MLX folder and its source."""
    add = ["add-mtp", "--source", str(src), "--target", str(tgt), "--json"]
    cmds = [(["inspect", str(tgt), "--json"], True), (["inspect", str(tgt), "--json", "--source", str(src)], True),
            (add, False), (add + ["--force"], False), (add + ["--layout", "embedded", "--force"], False),
            (add + ["--dry-run"], True), (add + ["--precision", "bf16", "--force"], False)]
    if base != "mlx":
        cmds += [(["remove-mtp", str(tgt), "--json"], False), (["verify", str(tgt), "--json"], True),
                 (["repair-norms", str(tgt), "--json"], False)]
    return cmds


def case_config(bench: Bench, root: Path, data: Any) -> Case:
    src, tgt, base = _mlx_case(bench, root, data)
    which = data.draw(st.sampled_from(["target", "target", "source"]), label="whose config")
    what = mutate_json_file(data, (tgt if which == "target" else src) / "config.json", "config.json")
    argv, ro = data.draw(st.sampled_from(_commands_mlx(src, tgt, base)), label="command")
    return Case(root, argv, f"{which} config.json: {what}", ro)


def case_index(bench: Bench, root: Path, data: Any) -> Case:
    src, tgt, base = _mlx_case(bench, root, data)
    which = data.draw(st.sampled_from(["target", "target", "source"]), label="whose index")
    what = mutate_json_file(data, (tgt if which == "target" else src) / "model.safetensors.index.json", "index")
    argv, ro = data.draw(st.sampled_from(_commands_mlx(src, tgt, base)), label="command")
    return Case(root, argv, f"{which} index: {what}", ro)


def _split(path: Path) -> tuple[bytes, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:8 + n], raw[8 + n:]


def mutate_header(data: Any, path: Path, label: str, names: Callable[[str], bool] | None = None) -> str:
    """Change one value of a safetensors header (or its length field, or the file's size)."""
    header, body = _split(path)
    if data.draw(st.integers(0, 9), label=f"{label}: file-level?") == 0:
        op = data.draw(st.sampled_from(["length-huge", "length-zero", "length-off", "truncate", "not-json", "trailing"]),
                       label=f"{label}: file op")
        n = len(header)
        raw = {"length-huge": struct.pack("<Q", 2**63 + 7) + header + body, "length-zero": struct.pack("<Q", 0) + header + body,
               "length-off": struct.pack("<Q", n + 3) + header + body,
               "truncate": (struct.pack("<Q", n) + header + body)[: 8 + n + len(body) // 2],
               "not-json": struct.pack("<Q", 9) + b"{not json" + body,
               "trailing": struct.pack("<Q", n) + header + body + b"\x00" * 64}[op]
        _replace(path, raw)
        return f"shard {op}"
    doc = json.loads(header)
    if names is not None:
        keep = [k for k in doc if names(k)]
        doc = {k: doc[k] for k in keep} | {k: v for k, v in doc.items() if k not in keep}
        paths = [p for p in _paths(doc) if names(str(p[0]))] or _paths(doc)
        path_ = data.draw(st.sampled_from(paths), label=f"{label}: path")
        op = data.draw(st.sampled_from(["replace", "tweak", "tweak", "delete"]), label=f"{label}: op")
        cur = doc
        for p in path_:
            cur = cur[p]
        value = data.draw(st.sampled_from(_tweaks(cur)) if op == "tweak" else VALUES, label=f"{label}: value")
        _set(doc, path_, value, op)
        what = f"{op} {'.'.join(map(str, path_))} -> {str(value)[:60]!r}"
    else:
        doc, what = mutate_doc(data, doc, label)
    new = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
    _replace(path, struct.pack("<Q", len(new)) + new + body)
    return what


def case_header(bench: Bench, root: Path, data: Any) -> Case:
    src, tgt, base = _mlx_case(bench, root, data)
    files = [tgt / "model.safetensors", src / SHARD_SRC] + ([tgt / "mtp.safetensors"] if base == "sidecar" else []) \
        + ([tgt / "model-mtp.safetensors"] if base == "embedded" else [])
    path = data.draw(st.sampled_from(files), label="shard")
    what = mutate_header(data, path, path.name)
    argv, ro = data.draw(st.sampled_from(_commands_mlx(src, tgt, base)), label="command")
    return Case(root, argv, f"{path.parent.name}/{path.name} header: {what}", ro)


def case_manifest(bench: Bench, root: Path, data: Any) -> Case:
    src, tgt, base = _mlx_case(bench, root, data, need_head=True)
    what = mutate_json_file(data, tgt / "mtpforge.json", "mtpforge.json")
    # inspect without --source decides the norms from the record, else by decoding (seconds):
    # once in the mix; the record's trust rules (remove-mtp, add-mtp) are the cheap majority
    cmds = _commands_mlx(src, tgt, base) + [(["remove-mtp", str(tgt), "--json"], False)] * 4 \
        + [(["inspect", str(tgt), "--json", "--source", str(src)], True)] * 2
    if bench.fast:
        cmds = [c for c in cmds if c[0] != ["inspect", str(tgt), "--json"]]
    argv, ro = data.draw(st.sampled_from(cmds), label="command")
    return Case(root, argv, f"mtpforge.json: {what}", ro)


def case_side_file(name: str) -> Callable[[Bench, Path, Any], Case]:
    def build(bench: Bench, root: Path, data: Any) -> Case:
        src, tgt, base = _mlx_case(bench, root, data, need_head=True)
        what = mutate_json_file(data, tgt / name, name)
        cmds = [(["inspect", str(tgt), "--json"], True)] * 3 + [(["verify", str(tgt), "--json"], True)] * 2 \
            + _commands_mlx(src, tgt, base)
        argv, ro = data.draw(st.sampled_from(cmds), label="command")
        return Case(root, argv, f"{name}: {what}", ro)
    return build


RECIPE = {
    "version": 1, "source": "./src", "target": "./tgt", "layout": "sidecar", "precision": "match", "experts": "auto",
    "fetch": "auto", "keep_fc_full_precision": False,
    "checks": {"inspect": {"strict": False, "allow_warnings": [], "compare_source": True},
               "verify": {"generate": False, "seed": 1, "max_tokens": 8, "depth": 1, "hidden": "auto", "temp": 0.0,
                          "min_acceptance": 0.0}},
}


def case_recipe(bench: Bench, root: Path, data: Any) -> Case:
    _copy(bench.hf, root / "src")
    _copy(getattr(bench, data.draw(st.sampled_from(["mlx", "sidecar"]), label="target")), root / "tgt")
    doc = json.loads(json.dumps(RECIPE))
    path = root / "recipe.yaml"
    if data.draw(st.integers(0, 9), label="recipe: file-level?") == 0:
        op = data.draw(st.sampled_from(FILE_OPS + ("tag", "anchor", "tabs")), label="recipe: file op")
        text = yaml.safe_dump(doc, sort_keys=False).encode()
        raw = {"tag": text + b"layout: !!python/object/apply:os.system ['true']\n",
               "anchor": text.replace(b"layout: sidecar", b"layout: &a sidecar\nprecision2: *a"),
               "tabs": text.replace(b"  ", b"\t")}.get(op) or damaged_text(text, op)
        path.write_bytes(raw)
        what = f"file {op}"
    else:
        doc, what = mutate_doc(data, doc, "recipe")
        try:
            path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), "utf-8", errors="surrogatepass")
        except (yaml.YAMLError, UnicodeError):
            path.write_bytes(b"source: [unwritable value\n")
    mode = data.draw(st.sampled_from([["--validate"]] * 4 + [["--dry-run"], []]), label="run mode")
    return Case(root, ["run", str(path), "--json", *mode], f"recipe: {what}", bool(mode), {"run": not mode})


# ----------------------------------------------------------------------------- GGUF

_U = gguf.GGUFValueType
GGUF_VALUES = st.one_of(
    st.tuples(st.just(_U.UINT32), st.sampled_from([0, 1, 2, 4, 7, 64, 2**24, 2**31, 2**32 - 1])),
    st.tuples(st.just(_U.UINT32), st.integers(0, 2**32 - 1)),
    st.tuples(st.just(_U.INT32), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just(_U.UINT64), st.sampled_from([0, 2**40, 2**63, 2**64 - 1])),
    st.tuples(st.just(_U.INT64), st.sampled_from([-1, -(2**63), 2**62])),
    st.tuples(st.just(_U.FLOAT32), st.floats(width=32, allow_nan=True, allow_infinity=True)),
    st.tuples(st.just(_U.BOOL), st.booleans()),
    st.tuples(st.just(_U.STRING), st.sampled_from(_SPECIAL_STRS[:20]) | st.text(max_size=10)),
    st.tuples(st.just(_U.ARRAY), st.lists(st.integers(0, 2**32 - 1), max_size=6)),
    st.tuples(st.just(_U.ARRAY), st.lists(st.booleans(), max_size=6)),
    st.tuples(st.just(_U.ARRAY), st.lists(st.text(max_size=5), max_size=4)),
)


def _rewrite_gguf(path: Path, key: str, value: Any, vtype: Any, delete: bool) -> None:
    from mtpforge.gguf.gguffile import KV, read_local
    from mtpforge.gguf.write import OutTensor, copy_chunks, write_gguf

    g = read_local(path)
    kv = dict(g.kv)
    arch = g.arch
    if delete:
        kv.pop(key, None)
    elif key == "general.architecture":
        arch = value if isinstance(value, str) and value else "x"
    else:
        sub = None
        if vtype == _U.ARRAY:
            sub = _U.BOOL if value and isinstance(value[0], bool) else _U.STRING if value and isinstance(value[0], str) else _U.UINT32
        kv[key] = KV(value, vtype, sub)
    out = [OutTensor(n, t.type, t.shape, t.nbytes, copy_chunks(g, t)) for n, t in g.tensors.items()]
    tmp = path.with_name("fuzz-" + path.name)
    # the declared alignment is the mutated value; the data stays laid out at the trunk's own
    # (laying it out at 2^32 - 1 would take the harness 4 GB a tensor)
    write_gguf(tmp, arch, kv, out, alignment=int(g.kv["general.alignment"].value) if "general.alignment" in g.kv else 32)
    os.replace(tmp, path)


def case_gguf(bench: Bench, root: Path, data: Any) -> Case:
    from mtpforge.gguf.gguffile import META, read_local

    src = _copy(bench.hf, root / "src")
    folder = _copy(data.draw(st.sampled_from([bench.gguf, bench.gguf_head]), label="gguf base"), root / "g")
    trunk = folder / "Tiny-Qwen3_5-F32.gguf"
    files = [trunk] + sorted(folder.glob("mtp-*.gguf"))
    path = data.draw(st.sampled_from(files), label="gguf file")
    manifests = sorted(folder.glob("*.mtpforge.json"))
    if manifests and data.draw(st.integers(0, 4), label="gguf manifest?") == 0:
        what = "head record: " + mutate_json_file(data, manifests[0], "gguf manifest")
    elif data.draw(st.integers(0, 14), label="gguf raw?") == 0:
        raw = path.read_bytes()
        cut = data.draw(st.integers(0, len(raw)), label="cut")
        _replace(path, raw[:cut] if data.draw(st.booleans()) else raw[:cut] + b"\xff" * 16 + raw[cut + 16:])
        what = f"{path.name} bytes damaged at {cut}"
    else:
        g = read_local(path)
        known = [t.format(arch=g.arch) for t in META]
        key = data.draw(st.sampled_from(sorted(set(g.kv) | set(known))), label="gguf key")
        vtype, value = data.draw(GGUF_VALUES, label="gguf value")
        delete = data.draw(st.integers(0, 7), label="delete?") == 0
        try:
            _rewrite_gguf(path, key, value, vtype, delete)
        except (ValueError, OverflowError, TypeError, ZeroDivisionError, struct.error) as e:  # gguf-py cannot write it: not a file anyone has
            what = f"(unwritable {key}={value!r}: {e.__class__.__name__})"
        else:
            what = f"{path.name} metadata {key} " + ("deleted" if delete else f"= {vtype.name} {str(value)[:40]!r}")
    add = ["add-mtp", "--source", str(src), "--target", str(trunk), "--json"]
    cmds = [(["inspect", str(trunk), "--json"], True), (["inspect", str(trunk), "--json", "--source", str(src)], True),
            (add, False), (add + ["--force"], False), (add + ["--dry-run"], True),
            (add + ["--layout", "gguf-tail", "--output", str(folder / "tail.gguf")], False)]
    argv, ro = data.draw(st.sampled_from(cmds), label="command")
    return Case(root, argv, what, ro)


# ----------------------------------------------------------------------------- FP8 scales


def case_fp8(bench: Bench, root: Path, data: Any) -> Case:
    src = _copy(bench.fp8, root / "src")
    tgt = _copy(getattr(bench, data.draw(st.sampled_from(["mlx", "mlx", "mlx", "sidecar"]), label="target")), root / "tgt")
    shard = src / SHARD_SRC
    header, body = _split(shard)
    doc = json.loads(header)
    fp8 = sorted(k for k, v in doc.items() if k != "__metadata__" and (k.endswith("_scale_inv") or v.get("dtype") == "F8_E4M3"))
    how = data.draw(st.sampled_from(["header", "header", "values", "norm-as-fp8", "drop-scale"]), label="fp8 how")
    if how == "values":
        k = data.draw(st.sampled_from([k for k in fp8 if k.endswith("_scale_inv")]), label="scale")
        b, e = doc[k]["data_offsets"]
        v = data.draw(st.sampled_from([float("nan"), float("inf"), -1.0, 0.0, 1e38, 1e-45]), label="scale value")
        n = (e - b) // 4
        body = body[:b] + struct.pack("<f", v) * n + body[e:]
        _replace(shard, struct.pack("<Q", len(header)) + header + body)
        what = f"{k} values = {v}"
    elif how == "norm-as-fp8":
        norms = sorted(k for k in doc if k.startswith("mtp.") and k.endswith("norm.weight"))
        k = data.draw(st.sampled_from(norms), label="norm") if norms else fp8[0]
        b = doc[k]["data_offsets"][0]
        doc[k]["dtype"] = "F8_E4M3"  # one byte per value: the config's shape, a shorter span
        doc[k]["data_offsets"] = [b, b + doc[k]["shape"][0]]
        if data.draw(st.booleans(), label="with a scale"):
            doc[f"{k}_scale_inv"] = {"dtype": "F32", "shape": [1], "data_offsets": [b + doc[k]["shape"][0], b + doc[k]["shape"][0] + 4]}
        new = json.dumps(doc).encode()
        _replace(shard, struct.pack("<Q", len(new)) + new + body)
        what = f"{k} stored as FP8"
    elif how == "drop-scale":
        k = data.draw(st.sampled_from([k for k in fp8 if k.endswith("_scale_inv")]), label="scale")
        del doc[k]
        new = json.dumps(doc).encode()
        _replace(shard, struct.pack("<Q", len(new)) + new + body)
        what = f"{k} removed"
    else:
        what = mutate_header(data, shard, "fp8", names=lambda name: name in fp8)
    add = ["add-mtp", "--source", str(src), "--target", str(tgt), "--json"]
    cmds = [(add, False), (add + ["--force"], False), (add + ["--dry-run"], True),
            (add + ["--precision", "bf16", "--force"], False), (["inspect", str(tgt), "--json", "--source", str(src)], True)]
    argv, ro = data.draw(st.sampled_from(cmds), label="command")
    return Case(root, argv, f"FP8 source: {what}", ro)


BUILDERS: dict[str, Callable[[Bench, Path, Any], Case]] = {
    "config": case_config, "index": case_index, "header": case_header, "manifest": case_manifest,
    "recipe": case_recipe, "gguf": case_gguf, "fp8": case_fp8,
    "generation_config": case_side_file("generation_config.json"), "tokenizer_config": case_side_file("tokenizer_config.json"),
}


# ----------------------------------------------------------------------------- running and judging


@dataclass
class Outcome:
    kind: str
    what: str
    argv: list[str]
    exit_code: int | None
    problems: list[str]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def invoke(argv: list[str]) -> tuple[int | None, str, str, BaseException | None]:
    """Run the CLI in this process, as ``python -m mtpforge`` runs it (run_command, rendering)."""
    return cli_in_process(argv, TIMEOUT_S)


def judge(case: Case, code: int | None, out: str, err: str, exc: BaseException | None, changed: bool) -> list[str]:
    problems = []
    if exc is not None:
        problems.append(f"exception escaped: {exc.__class__.__name__}: {str(exc)[:300]}")
    if code not in (0, 1, 2):
        problems.append(f"exit {code}")
    if "Traceback" in out + err:
        problems.append("a traceback: " + err[-400:])
    if "internal error" in err or '"INTERNAL"' in out:
        problems.append("internal error: " + next((ln for ln in err.splitlines() if "internal error" in ln), err[-300:]))
    try:
        obj = json.loads(out) if out.strip() else None
    except ValueError:
        obj = None
        problems.append(f"stdout is not one JSON object: {out[:200]!r}")
    report = isinstance(obj, dict) and "error" not in obj
    if code in (1, 2) and not report:
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        if len(lines) != 1 or " — fix: " not in lines[0] or lines[0].endswith(" — fix: "):
            problems.append(f"not one 'error: … — fix: …' line: {lines[:3]} / {err[-300:]!r}")
        e = obj.get("error") if isinstance(obj, dict) else None
        if not (isinstance(e, dict) and e.get("code") and e.get("message") and e.get("fix")):
            problems.append(f"JSON error object without code, message and fix: {e!r}")
    if code == 2 and report:
        problems.append("exit 2 with a report instead of an error")
    may_write = code == 0 or (case.extra.get("run") and report)
    if changed and (case.read_only or not may_write):
        problems.append(f"the case folder changed ({'read-only command' if case.read_only else f'exit {code}'})")
    return problems


def run_example(bench: Bench, kind: str, data: Any, work: Path, fast: bool = False) -> Outcome:
    import time

    bench.n += 1
    bench.fast = fast
    root = work / f"case-{bench.n}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    try:
        case = BUILDERS[kind](bench, root, data)
        before = folder_state(root)
        t0 = time.monotonic()
        try:
            code, out, err, exc = invoke(case.argv)
        except CliTimeout:
            return Outcome(kind, case.what, case.argv, None, [f"no answer within {TIMEOUT_S} s"], TIMEOUT_S)
        seconds = time.monotonic() - t0
        after = folder_state(root)
        problems = judge(case, code, out, err, exc, after != before)
        if problems and after != before:
            diff = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            problems.append(f"changed: {diff[:5]}")
        return Outcome(kind, case.what, [a.replace(str(root), "<case>") for a in case.argv], code, problems, seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def environment(home: Path) -> dict[str, str]:
    """What every example runs under: offline, a private Hugging Face home, wide lines."""
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "COLUMNS": "1000", "NO_COLOR": "1"}


__all__ = ["KINDS", "Bench", "Outcome", "make_bench", "run_example", "environment", "judge", "invoke"]
