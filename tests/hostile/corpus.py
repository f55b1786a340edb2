"""The hostile corpus: one row per malformed or malicious input, as data.

Each case copies a tiny source (HF, ``qwen3_5``) and target (its MLX conversion) into a fresh
folder, damages one thing, and names the command to run. ``tests/test_hostile.py`` runs each
through the real CLI in a subprocess and demands one clear line, exit 1 or 2, no traceback, and
nothing written anywhere under the case's folder. New hostile inputs add rows, not code.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: placeholders in ``argv``: {src} {tgt} {root} {recipe}
ADD = ("add-mtp", "--source", "{src}", "--target", "{tgt}")
INSPECT = ("inspect", "{tgt}", "--json")
RUN = ("run", "{recipe}")
VALIDATE = ("run", "{recipe}", "--validate")

TARGET_SHARD = "model.safetensors"
SOURCE_MTP_SHARD = "model-00002-of-00003.safetensors"  # holds mtp.fc.weight (and backbone tensors)
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Ctx:
    root: Path
    src: Path
    tgt: Path

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.yaml"


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Ctx], None]
    argv: tuple[str, ...] = ADD
    exits: tuple[int, ...] = (1, 2)
    says: str = ""  # a substring the one error line (or, for inspect --json, a finding code) holds


# ----------------------------------------------------------------------------- file surgery

def split_st(path: Path) -> tuple[bytes, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:8 + n], raw[8 + n:]


def put_st(path: Path, header: bytes, data: bytes, length: int | None = None) -> None:
    """Replace ``path`` (a new inode: the copies share nothing with the session originals)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    os.replace(tmp, path)


def header_edit(rel: str, fn: Callable[[dict], None], *, in_src: bool = False) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        p = (c.src if in_src else c.tgt) / rel
        hdr, data = split_st(p)
        obj = json.loads(hdr)
        fn(obj)
        put_st(p, json.dumps(obj).encode(), data)
    return build


def header_bytes(rel: str, raw: bytes, length: int | None = None) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        _, data = split_st(c.tgt / rel)
        put_st(c.tgt / rel, raw, data, length)
    return build


def _first(obj: dict) -> str:
    return next(k for k in obj if k != "__metadata__")


def _two(obj: dict) -> tuple[str, str]:
    ks = sorted((k for k in obj if k != "__metadata__"), key=lambda k: obj[k]["data_offsets"][0])
    return ks[0], ks[1]


def _overlap(obj: dict) -> None:
    a, b = _two(obj)
    span = obj[a]["data_offsets"][1] - obj[a]["data_offsets"][0]
    obj[b] = dict(obj[b], data_offsets=[obj[a]["data_offsets"][0], obj[a]["data_offsets"][0] + span],
                  shape=obj[a]["shape"], dtype=obj[a]["dtype"])


def _out_of_range(obj: dict) -> None:
    k = _first(obj)
    b, e = obj[k]["data_offsets"]
    obj[k]["data_offsets"] = [b + 10**9, e + 10**9]


def _reversed(obj: dict) -> None:
    k = _first(obj)
    b, e = obj[k]["data_offsets"]
    obj[k]["data_offsets"] = [e, b]


def _span_mismatch(obj: dict) -> None:
    k = _first(obj)
    obj[k]["shape"] = [d * 2 for d in obj[k]["shape"]]


def _dtype(value: str) -> Callable[[dict], None]:
    def fn(obj: dict) -> None:
        obj[_first(obj)]["dtype"] = value
    return fn


def _shape(value: object) -> Callable[[dict], None]:
    def fn(obj: dict) -> None:
        obj[_first(obj)]["shape"] = value
    return fn


def _metadata(value: object) -> Callable[[dict], None]:
    def fn(obj: dict) -> None:
        obj["__metadata__"] = value
    return fn


def _duplicate_names(c: Ctx) -> None:
    p = c.tgt / TARGET_SHARD
    hdr, data = split_st(p)
    obj = json.loads(hdr)
    k = _first(obj)
    text = json.dumps(obj)
    dup = json.dumps({k: obj[k]})[1:-1]
    put_st(p, (text[:-1] + ", " + dup + "}").encode(), data)


def _mtp_as_fp8(obj: dict) -> None:
    e = obj["mtp.fc.weight"]
    e["dtype"] = "F8_E4M3"
    e["shape"] = [e["shape"][0], e["shape"][1] * 2]


def _mtp_wrong_shape(obj: dict) -> None:
    e = obj["mtp.fc.weight"]
    e["shape"] = [e["shape"][1], e["shape"][0]]  # [2H, H] instead of [H, 2H]: same bytes, wrong head


# ----------------------------------------------------------------------------- JSON files

def write(rel: str, data: bytes | str, *, in_src: bool = False) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        p = (c.src if in_src else c.tgt) / rel
        if p.is_symlink() or p.exists():
            p.unlink()
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    return build


def json_edit(rel: str, fn: Callable[[dict], object], *, in_src: bool = False) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        p = (c.src if in_src else c.tgt) / rel
        obj = json.loads(p.read_text())
        res = fn(obj)
        p.unlink()
        p.write_text(json.dumps(obj if res is None else res, allow_nan=True))
    return build


def text_cfg(key: str, value: object) -> Callable[[dict], None]:
    def fn(cfg: dict) -> None:
        cfg["text_config"][key] = value
    return fn


def weight_map(fn: Callable[[dict], None]) -> Callable[[dict], None]:
    def edit(idx: dict) -> None:
        fn(idx["weight_map"])
    return edit


def _llama(cfg: dict) -> None:
    cfg["model_type"] = "llama"
    cfg["text_config"]["model_type"] = "llama"


def _point_first(value: str) -> Callable[[dict], None]:
    def fn(wm: dict) -> None:
        wm[next(iter(wm))] = value
    return fn


def _point_mtp(value: str) -> Callable[[dict], None]:
    def fn(wm: dict) -> None:
        wm["mtp.fc.weight"] = value
    return fn


DEEP = "[" * 200_000 + "]" * 200_000


# ----------------------------------------------------------------------------- folders

def _remove(rel: str, *, in_src: bool = False) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        ((c.src if in_src else c.tgt) / rel).unlink()
    return build


def _target_is_file(c: Ctx) -> None:
    for p in c.tgt.iterdir():
        p.unlink()
    c.tgt.rmdir()
    c.tgt.write_text("not a folder\n")


def _source_is_file(c: Ctx) -> None:
    for p in c.src.iterdir():
        p.unlink()
    c.src.rmdir()
    c.src.write_text("not a folder\n")


def _target_symlink(c: Ctx) -> None:
    real = c.root / "real-target"
    os.rename(c.tgt, real)
    os.symlink(real, c.tgt)


def _symlink_loop(rel: str) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        os.symlink(f"{rel}.b", c.tgt / rel)
        os.symlink(rel, c.tgt / f"{rel}.b")
    return build


def _config_loop(c: Ctx) -> None:
    (c.tgt / "config.json").unlink()
    os.symlink("config.json", c.tgt / "config.json")


def _dir_named_like_shard(c: Ctx) -> None:
    (c.tgt / "model-00002-of-00002.safetensors").mkdir()
    json_edit(INDEX, weight_map(_point_first("model-00002-of-00002.safetensors")))(c)


def _config_is_dir(c: Ctx) -> None:
    (c.tgt / "config.json").unlink()
    (c.tgt / "config.json").mkdir()


def _index_is_dir(c: Ctx) -> None:
    (c.tgt / INDEX).unlink()
    (c.tgt / INDEX).mkdir()


def _output_not_empty(c: Ctx) -> None:
    (c.root / "out").mkdir()
    (c.root / "out" / "keep.txt").write_text("mine\n")


def _output_is_file(c: Ctx) -> None:
    (c.root / "out").write_text("mine\n")


def _source_is_target(c: Ctx) -> None:
    """A converted MLX folder passed as the source."""
    import shutil

    shutil.rmtree(c.src)
    shutil.copytree(c.tgt, c.src)


def _target_is_source(c: Ctx) -> None:
    import shutil

    shutil.rmtree(c.tgt)
    shutil.copytree(c.src, c.tgt)


def _source_without_head(c: Ctx) -> None:
    """Index without mtp.* entries and shards without the tensors (header and data rewritten)."""
    import mlx.core as mx

    for f in sorted(c.src.glob("*.safetensors")):
        t = {k: v for k, v in mx.load(str(f)).items() if not k.startswith("mtp.")}
        tmp = f.with_name(f.name + ".tmp.safetensors")
        mx.save_safetensors(str(tmp), t, metadata={"format": "pt"})
        os.replace(tmp, f)
    json_edit(INDEX, weight_map(lambda wm: [wm.pop(k) for k in list(wm) if k.startswith("mtp.")]), in_src=True)(c)


def _hostile_manifest(added: Callable[[Ctx], list[str]], changed: dict | None = None, *,
                      link_sub: bool = False) -> Callable[[Ctx], None]:
    """A manifest whose paths lead out of the folder (to canaries inside the case's own folder:
    a test of path escapes must not be able to damage anything if the escape works)."""
    def build(c: Ctx) -> None:
        (c.root / "canary.txt").write_text("must survive\n")
        if link_sub:
            (c.root / "outside").mkdir()
            (c.root / "outside" / "canary.txt").write_text("must survive\n")
            os.symlink(c.root / "outside", c.tgt / "sub")
        (c.tgt / "mtpforge.json").write_text(json.dumps({"mtpforge_manifest": 1, "added": added(c), "changed": changed or {}}))
    return build


def recipe(text: str | bytes) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        body = text.replace("{src}", str(c.src)).replace("{tgt}", str(c.tgt)) if isinstance(text, str) else text
        c.recipe.write_bytes(body.encode() if isinstance(body, str) else body)
    return build


def _both(*builds: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        for b in builds:
            b(c)
    return build


OK_RECIPE = "source: {src}\ntarget: {tgt}\n"
BILLION_LAUGHS = OK_RECIPE + "layout: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"l{i}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


def _fifo(rel: str) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        os.mkfifo(c.tgt / rel)
    return build


def _src_fifo(c: Ctx) -> None:
    os.mkfifo(c.src / "model-00004-of-00004.safetensors")


def _q_entry(value: object) -> Callable[[dict], None]:
    def fn(cfg: dict) -> None:
        q = cfg.setdefault("quantization", {})
        q.update(value if isinstance(value, dict) else {"bits": value})
        cfg["quantization_config"] = dict(q)
    return fn


def _absurd_shape(obj: dict) -> None:
    e = obj["mtp.fc.weight"]
    e["shape"] = [2**40, 2**40]


def _fp8_scale(bad: object) -> Callable[[dict], None]:
    """An FP8 head whose scale tensor is malformed (wrong shape or dtype)."""
    def fn(obj: dict) -> None:
        _mtp_as_fp8(obj)
        name = next(k for k in obj if k != "__metadata__" and k != "mtp.fc.weight")
        scale = obj.pop(name)
        obj["mtp.fc.weight_scale_inv"] = dict(scale, **bad)  # type: ignore[arg-type]
    return fn


def _manifest(obj: object) -> Callable[[Ctx], None]:
    def build(c: Ctx) -> None:
        (c.tgt / "mtpforge.json").write_text(json.dumps(obj))
    return build


# ----------------------------------------------------------------------------- the corpus

CASES: list[Case] = [
    # safetensors headers of a target shard
    Case("header_len_beyond_file", header_bytes(TARGET_SHARD, b'{"a":1}', length=10**6), says="damaged"),
    Case("header_len_absurd", header_bytes(TARGET_SHARD, b"{}", length=2**63 + 5), says="damaged"),
    Case("header_not_json", header_bytes(TARGET_SHARD, b"{not json at all}"), says="damaged"),
    Case("header_not_utf8", header_bytes(TARGET_SHARD, b'{"\xff\xfe": 1}'), says="damaged"),
    Case("header_json_array", header_bytes(TARGET_SHARD, b"[1, 2, 3]"), says="damaged"),
    Case("header_deep_nesting", header_bytes(TARGET_SHARD, DEEP.encode()), says="damaged"),
    Case("header_unknown_dtype", header_edit(TARGET_SHARD, _dtype("Q7_FANCY")), says="unknown dtype"),
    Case("header_offsets_overlap", header_edit(TARGET_SHARD, _overlap), says="overlap"),
    Case("header_offsets_out_of_range", header_edit(TARGET_SHARD, _out_of_range), says="outside"),
    Case("header_offsets_reversed", header_edit(TARGET_SHARD, _reversed), says="damaged"),
    Case("header_shape_dtype_span_mismatch", header_edit(TARGET_SHARD, _span_mismatch), says="needs"),
    Case("header_negative_dim", header_edit(TARGET_SHARD, _shape([-4, 8])), says="invalid shape"),
    Case("header_float_dim", header_edit(TARGET_SHARD, _shape([1.5, 8])), says="invalid shape"),
    Case("header_duplicate_names", _duplicate_names, says="duplicate"),
    Case("header_metadata_not_strings", header_edit(TARGET_SHARD, _metadata({"format": 1})), says="__metadata__"),
    Case("shard_empty", write(TARGET_SHARD, b""), says="damaged"),
    Case("shard_truncated_data", lambda c: (c.tgt / TARGET_SHARD).write_bytes((c.tgt / TARGET_SHARD).read_bytes()[:-1000]),
         says="damaged"),
    Case("shard_symlink_loop", _symlink_loop("model-loop.safetensors")),
    Case("shard_is_directory", _dir_named_like_shard),
    Case("inspect_header_not_json", header_bytes(TARGET_SHARD, b"{nope"), argv=INSPECT, exits=(1,), says="CORRUPT_FILE"),
    Case("inspect_shard_symlink_loop", _symlink_loop("model-loop.safetensors"), argv=INSPECT, exits=(1,)),
    Case("inspect_index_names_missing_shard", json_edit(INDEX, weight_map(_point_first("model-00009-of-00009.safetensors"))),
         argv=INSPECT, exits=(1,), says="INDEX_INCONSISTENT"),
    # the source's shards and index
    Case("source_shard_corrupt", lambda c: put_st(c.src / SOURCE_MTP_SHARD, b"{bad", split_st(c.src / SOURCE_MTP_SHARD)[1]),
         says="damaged"),
    Case("source_mtp_fp8_unscaled", header_edit(SOURCE_MTP_SHARD, _mtp_as_fp8, in_src=True)),
    Case("source_mtp_shape_inconsistent_with_config", header_edit(SOURCE_MTP_SHARD, _mtp_wrong_shape, in_src=True)),
    Case("source_without_mtp_head", _source_without_head, says="no MTP tensors"),
    Case("source_index_dotdot", json_edit(INDEX, weight_map(_point_mtp("../../etc/passwd")), in_src=True), says="outside"),
    Case("source_index_absolute", json_edit(INDEX, weight_map(_point_mtp("/etc/passwd")), in_src=True), says="absolute"),
    Case("source_index_missing_shard", json_edit(INDEX, weight_map(_point_mtp("model-00007-of-00009.safetensors")),
                                                 in_src=True)),
    Case("source_index_not_json", write(INDEX, "{'weight_map': ", in_src=True), says="not valid JSON"),
    Case("source_index_is_list", write(INDEX, "[]", in_src=True), says="not a JSON object"),
    Case("source_index_weight_map_not_dict", write(INDEX, '{"weight_map": [1, 2]}', in_src=True), says="weight_map"),
    Case("source_index_values_not_str", json_edit(INDEX, weight_map(_point_mtp(7)), in_src=True), says="weight_map"),  # type: ignore[arg-type]
    Case("source_index_deep_nesting", write(INDEX, DEEP, in_src=True)),
    # the embedded layout writes the index (a sidecar never reads or writes it)
    Case("target_index_is_directory", _index_is_dir, argv=ADD + ("--layout", "embedded")),
    # configs
    Case("target_config_missing", _remove("config.json"), says="config.json"),
    Case("target_config_not_json", write("config.json", "{model_type: qwen3_5"), says="not valid JSON"),
    Case("target_config_not_utf8", write("config.json", b'{"model_type": "\xff"}'), says="not valid JSON"),
    Case("target_config_is_list", write("config.json", "[1]"), says="not a JSON object"),
    Case("target_config_deep_nesting", write("config.json", DEEP)),
    Case("target_config_is_directory", _config_is_dir),
    Case("target_config_symlink_loop", _config_loop),
    Case("target_other_family", json_edit("config.json", _llama), says="llama"),
    Case("source_config_missing", _remove("config.json", in_src=True), says="config.json"),
    Case("source_other_family", json_edit("config.json", lambda c: c.update(model_type="llama", text_config={}),
                                          in_src=True), says="not a model mtpforge handles"),
    Case("source_config_nan_dims", json_edit("config.json", text_cfg("hidden_size", float("nan")), in_src=True)),
    Case("source_config_inf_dims", json_edit("config.json", text_cfg("intermediate_size", float("inf")), in_src=True)),
    Case("source_config_huge_dims", json_edit("config.json", text_cfg("hidden_size", 10**15), in_src=True)),
    Case("source_config_string_dims", json_edit("config.json", text_cfg("hidden_size", "128"), in_src=True)),
    Case("source_config_bool_dims", json_edit("config.json", text_cfg("num_attention_heads", True), in_src=True)),
    Case("source_config_text_config_not_dict", json_edit("config.json", lambda c: c.update(text_config=[1]), in_src=True)),
    Case("source_config_mtp_layers_huge", json_edit("config.json", text_cfg("mtp_num_hidden_layers", 10**9), in_src=True)),
    Case("source_config_mtp_layers_negative", json_edit("config.json", text_cfg("mtp_num_hidden_layers", -1), in_src=True)),
    Case("target_config_hidden_differs", json_edit("config.json", text_cfg("hidden_size", 256))),
    Case("target_config_nan_dims", json_edit("config.json", text_cfg("hidden_size", float("nan")))),
    Case("target_config_quantization_not_dict", json_edit("config.json", lambda c: c.update(quantization=4))),
    # what the paths are
    Case("target_is_a_file", _target_is_file, says="is a file"),
    Case("target_missing", lambda c: None, argv=("add-mtp", "--source", "{src}", "--target", "{root}/nope"), says="does not exist"),
    Case("target_is_symlink", _target_symlink, says="symlink"),
    Case("target_is_raw_hf", _target_is_source, says="raw Hugging Face"),
    Case("source_is_a_file", _source_is_file),
    Case("source_is_converted_mlx", _source_is_target, says="converted"),
    Case("source_is_not_a_repo_id", lambda c: None, argv=("add-mtp", "--source", "a/b/c", "--target", "{tgt}")),
    Case("output_not_empty", _output_not_empty, argv=ADD + ("--output", "{root}/out"), says="not empty"),
    Case("output_is_a_file", _output_is_file, argv=ADD + ("--output", "{root}/out")),
    Case("inspect_target_is_a_file", _target_is_file, argv=INSPECT, exits=(2,), says="is a file"),
    Case("inspect_config_not_json", write("config.json", "{"), argv=INSPECT, exits=(2,), says="not valid JSON"),
    Case("remove_mtp_without_manifest", lambda c: None, argv=("remove-mtp", "{tgt}"), exits=(1,), says="mtpforge.json"),
    Case("remove_mtp_manifest_not_json", write("mtpforge.json", "{"), argv=("remove-mtp", "{tgt}"), exits=(1,)),
    Case("remove_mtp_manifest_absolute_path", _hostile_manifest(lambda c: [str(c.root / "canary.txt")]),
         argv=("remove-mtp", "{tgt}"), exits=(1,), says="outside"),
    Case("remove_mtp_manifest_dotdot_path", _hostile_manifest(lambda c: ["../canary.txt"]),
         argv=("remove-mtp", "{tgt}"), exits=(1,), says="outside"),
    Case("remove_mtp_manifest_changes_outside", _hostile_manifest(lambda c: [], {"../canary.txt": {"kind": "absent"}}),
         argv=("remove-mtp", "{tgt}"), exits=(1,), says="outside"),
    Case("remove_mtp_through_symlinked_folder", _hostile_manifest(lambda c: ["sub/canary.txt"], link_sub=True),
         argv=("remove-mtp", "{tgt}"), exits=(1,), says="cannot be trusted"),
    # recipes
    Case("recipe_python_tag", recipe(OK_RECIPE + "layout: !!python/object/apply:os.system ['touch {tgt}/PWNED']\n"),
         argv=RUN, exits=(2,), says="not allowed"),
    Case("recipe_python_name_tag", recipe("!!python/name:os.system\n"), argv=VALIDATE, exits=(2,), says="not allowed"),
    Case("recipe_unknown_key", recipe(OK_RECIPE + "layuot: embedded\n"), argv=RUN, exits=(2,), says="layuot"),
    Case("recipe_not_mapping", recipe("- source\n- target\n"), argv=RUN, exits=(2,)),
    Case("recipe_empty", recipe(""), argv=RUN, exits=(2,), says="empty"),
    Case("recipe_not_utf8", recipe(b"source: \xff\xfe\n"), argv=RUN, exits=(2,), says="UTF-8"),
    Case("recipe_duplicate_key", recipe(OK_RECIPE + "source: {tgt}\n"), argv=RUN, exits=(2,), says="duplicate"),
    Case("recipe_billion_laughs", recipe(BILLION_LAUGHS), argv=VALIDATE, exits=(2,)),
    Case("run_recipe_damaged_target", _both(recipe(OK_RECIPE), header_bytes(TARGET_SHARD, b"{nope")), argv=RUN,
         exits=(1,), says="damaged"),
    Case("run_recipe_target_is_a_file", _both(recipe(OK_RECIPE), _target_is_file), argv=RUN, exits=(2,)),
    Case("run_recipe_source_other_family", _both(recipe(OK_RECIPE), json_edit(
        "config.json", lambda c: c.update(model_type="llama", text_config={}), in_src=True)), argv=RUN, exits=(1, 2)),
    Case("inspect_header_len_absurd", header_bytes(TARGET_SHARD, b"{}", length=2**63 + 5), argv=INSPECT, exits=(1,),
         says="CORRUPT_FILE"),
    Case("inspect_duplicate_names", _duplicate_names, argv=INSPECT, exits=(1,), says="CORRUPT_FILE"),
    Case("recipe_missing", lambda c: None, argv=("run", "{root}/nope.yaml"), exits=(2,), says="does not exist"),
    # crashes found by the second reliability round: each is one clear line now
    Case("output_inside_target", lambda c: None, argv=ADD + ("--output", "{tgt}/out"), exits=(2,), says="inside the target"),
    Case("output_is_target", lambda c: None, argv=ADD + ("--output", "{tgt}"), exits=(2,)),
    Case("target_fifo_shard", _fifo("model-00009-of-00009.safetensors"), says="not a regular file"),
    Case("inspect_target_fifo_shard", _fifo("model-00009-of-00009.safetensors"), argv=INSPECT, exits=(1, 2)),
    Case("source_fifo_shard", _src_fifo, says="not a regular file"),
    Case("precision_superscript_digit", lambda c: None, argv=ADD + ("--precision", "²"), exits=(2,), says="--precision"),
    Case("verify_seed_negative", lambda c: None, argv=("verify", "{tgt}", "--seed", "-1"), exits=(2,), says="--seed"),
    Case("target_quantization_bits_string", json_edit("config.json", _q_entry("four"))),
    Case("target_quantization_bits_zero", json_edit("config.json", _q_entry(0))),
    Case("target_quantization_group_huge", json_edit("config.json", _q_entry({"bits": 4, "group_size": 10**12}))),
    Case("target_quantization_mode_list", json_edit("config.json", _q_entry({"bits": 4, "group_size": 64, "mode": [1]}))),
    Case("target_quantization_group_unsupported", json_edit("config.json", _q_entry({"bits": 4, "group_size": 100})),
         says="config.json"),
    Case("source_mtp_absurd_shape", header_edit(SOURCE_MTP_SHARD, _absurd_shape, in_src=True)),
    Case("target_absurd_shape", header_edit(TARGET_SHARD, _shape([2**40, 2**40]))),
    Case("source_fp8_scale_wrong_shape", header_edit(SOURCE_MTP_SHARD, _fp8_scale({"shape": [3, 5, 7]}), in_src=True)),
    Case("source_fp8_scale_wrong_dtype", header_edit(SOURCE_MTP_SHARD, _fp8_scale({"dtype": "I8"}), in_src=True)),
    Case("manifest_source_not_dict", _manifest({"mtpforge_manifest": 2, "source": "x", "options": 3, "added": [],
                                                "changed": {}}), exits=(1,)),
    Case("manifest_hashes_not_dict", _manifest({"mtpforge_manifest": 2, "file_sha256": [1], "added": ["model-mtp.safetensors"],
                                                "changed": {}}), argv=("remove-mtp", "{tgt}"), exits=(1,)),
    Case("manifest_changed_kind_odd", _manifest({"added": [], "changed": {"config.json": {"kind": ["file"], "text": 5}}}),
         argv=("remove-mtp", "{tgt}"), exits=(1,)),
]
