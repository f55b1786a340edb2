"""Whole-folder findings beyond the head: what makes a model folder fail to load or to stop.

A generic checker catches these on any MLX folder, so inspect must too: a quantized module whose
stored shapes contradict the bits/group the config makes the loader build, a tokenizer that is
missing or cannot be read, eos/pad ids that disagree between config, generation_config and
tokenizer, and a missing chat template. Local folders only (over HTTP inspect reads headers).
Each check is a small function from what it reads to findings (docs/FINDINGS.md).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

from ..checkpoint.catalogue import Catalogue
from ..checkpoint.store import Store
from ..errors import MtpforgeError
from ..findings import ERROR, Finding, finding
from ..layouts.quant import per_path_entries, quant_defaults

if TYPE_CHECKING:
    from .context import InspectContext

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _is_head(key: str) -> bool:
    return key.startswith("mtp.") or ".mtp." in key


def quantized_shape_findings(cat: Catalogue) -> list[Finding]:
    """Every quantized backbone module (``.scales`` stored) against the config's bits/group.

    ``weight`` is packed to in·bits/32 uint32 columns and ``scales`` has in/group columns, so a
    module agrees with the config iff packed·32 == scales·group·bits (and ``biases``, for affine,
    has the scales' shape). The head is checked by inspect's own MTP precision check.
    """
    default = quant_defaults(cat.config)
    entries = per_path_entries(cat.config)
    tensors = cat.tensors
    bad: list[str] = []
    for key, s in tensors.items():
        if not key.endswith(".scales") or _is_head(key):
            continue
        path = key[: -len(".scales")]
        w = tensors.get(f"{path}.weight")
        if w is None or not w.shape or not s.shape:
            continue
        e = entries.get(path)
        if e is False:
            bad.append(f"{path}: stored quantized, config says unquantized")
            continue
        q = dict(default or {})
        if isinstance(e, dict):
            q.update({k: e[k] for k in ("bits", "group_size", "mode") if k in e})
        bits, group = q.get("bits"), q.get("group_size")
        if not isinstance(bits, int) or not isinstance(group, int):
            bad.append(f"{path}: stored quantized, config declares no quantization")
            continue
        if w.shape[-1] * 32 != s.shape[-1] * group * bits:
            stored_bits = w.shape[-1] * 32 / (s.shape[-1] * group) if s.shape[-1] else 0
            bad.append(f"{path}: weight {list(w.shape)} / scales {list(s.shape)} is not {bits}-bit group {group} "
                       f"(fits {stored_bits:g}-bit)")
            continue
        b = tensors.get(f"{path}.biases")
        if q.get("mode", "affine") == "affine" and b is not None and tuple(b.shape) != tuple(s.shape):
            bad.append(f"{path}: biases {list(b.shape)} differ from scales {list(s.shape)}")
    if not bad:
        return []
    return [finding(
        "QUANT_CONFIG_MISMATCH",
        f"{len(bad)} backbone module(s) are stored at another precision than the config makes the loader build: {bad[0]}",
        "re-convert the model (mlx_lm.convert) or add a per-module entry under \"quantization\" and "
        "\"quantization_config\" in config.json",
    )]


def _json(store: Store, rel: str) -> Any:
    try:
        obj = json.loads(store.read_bytes(rel)) if store.exists(rel) else None
    except (ValueError, UnicodeDecodeError, RecursionError, OSError, MtpforgeError):
        return None  # a damaged side file is not this check's finding; a missing value is
    return obj if isinstance(obj, dict) else None


def _ids(v: Any) -> set[int]:
    if isinstance(v, bool):
        return set()
    if isinstance(v, int):
        return {v}
    if isinstance(v, list):
        return {x for x in v if isinstance(x, int) and not isinstance(x, bool)}
    return set()


def _token_text(v: Any) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def tokenizer_findings(store: Store, config: Mapping[str, Any]) -> list[Finding]:
    """Tokenizer present and loadable; eos/pad consistent; chat template present."""
    out: list[Finding] = []
    present = [f for f in TOKENIZER_FILES if store.exists(f)]
    if not present:
        out.append(finding("TOKENIZER_MISSING", "no tokenizer in the folder (tokenizer.json, tokenizer.model or "
                           "vocab.json): mlx_lm.load and every runtime fail",
                           "copy tokenizer.json and tokenizer_config.json from the original model"))
        return out
    vocab: dict[str, int] | None = None
    if "tokenizer.json" in present:
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(store.read_bytes("tokenizer.json").decode("utf-8"))
            vocab = tok.get_vocab(with_added_tokens=True)
        except Exception as e:  # any parse failure is the finding  # noqa: BLE001
            out.append(finding("TOKENIZER_UNREADABLE", f"tokenizer.json cannot be loaded ({str(e).splitlines()[0][:120]})",
                               "re-download tokenizer.json from the original model"))
    tcfg = _json(store, "tokenizer_config.json") or {}
    gen = _json(store, "generation_config.json") or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    if vocab is not None:
        out += _eos_pad(config, text, gen, tcfg, vocab)
    has_template = bool(tcfg.get("chat_template")) or any(store.exists(f) for f in CHAT_TEMPLATE_FILES)
    if not has_template:
        out.append(finding("CHAT_TEMPLATE_MISSING", "no chat template (tokenizer_config.json chat_template or "
                           "chat_template.jinja): chat use in mlx-lm and the runtimes fails or formats wrongly",
                           "copy chat_template.jinja (or tokenizer_config.json) from the original model"))
    return out


def _eos_pad(config: Mapping[str, Any], text: Mapping[str, Any], gen: Mapping[str, Any],
             tcfg: Mapping[str, Any], vocab: Mapping[str, int]) -> list[Finding]:
    ntok = max(vocab.values(), default=-1) + 1
    declared = {
        "config.json eos_token_id": _ids(config.get("eos_token_id")) | _ids(text.get("eos_token_id")),
        "generation_config.json eos_token_id": _ids(gen.get("eos_token_id")),
        "config.json pad_token_id": _ids(config.get("pad_token_id")) | _ids(text.get("pad_token_id")),
        "generation_config.json pad_token_id": _ids(gen.get("pad_token_id")),
    }
    fix = "make eos_token_id / pad_token_id in config.json and generation_config.json name the tokenizer's tokens"
    out: list[Finding] = []
    for where, ids in declared.items():
        bad = sorted(i for i in ids if not 0 <= i < ntok)
        if bad:
            out.append(finding("EOS_PAD_INCONSISTENT", f"{where} names token id {bad[0]}, which the tokenizer does not "
                               f"have ({ntok} tokens)", fix, severity=ERROR))
    if out:
        return out
    eos_text, pad_text = _token_text(tcfg.get("eos_token")), _token_text(tcfg.get("pad_token"))
    eos_tok = vocab.get(eos_text) if eos_text else None
    pad_tok = vocab.get(pad_text) if pad_text else None
    if eos_text and eos_tok is None:
        out.append(finding("EOS_PAD_INCONSISTENT", f"tokenizer_config.json eos_token {eos_text!r} is not a token of "
                           "tokenizer.json", fix))
    stops = declared["config.json eos_token_id"] | declared["generation_config.json eos_token_id"]
    if eos_tok is not None and stops and eos_tok not in stops:
        out.append(finding("EOS_PAD_INCONSISTENT", f"the tokenizer ends turns with {eos_text!r} (id {eos_tok}), but "
                           f"config/generation_config stop at {sorted(stops)}: generation runs past the end of a reply",
                           fix))
    cfg_eos, gen_eos = declared["config.json eos_token_id"], declared["generation_config.json eos_token_id"]
    if cfg_eos and gen_eos and not cfg_eos & gen_eos:
        out.append(finding("EOS_PAD_INCONSISTENT", f"config.json stops at {sorted(cfg_eos)} but generation_config.json "
                           f"at {sorted(gen_eos)}", fix))
    pads = declared["config.json pad_token_id"] | declared["generation_config.json pad_token_id"]
    if pad_tok is not None and pads and pad_tok not in pads:
        out.append(finding("EOS_PAD_INCONSISTENT", f"the tokenizer pads with {pad_text!r} (id {pad_tok}), config/"
                           f"generation_config with {sorted(pads)}", fix))
    return out


def folder_findings(cat: Catalogue) -> list[Finding]:
    """All whole-folder checks of a local MLX or Hugging Face model folder."""
    return quantized_shape_findings(cat) + tokenizer_findings(cat.store, cat.config)


def check(ctx: "InspectContext") -> list[Finding]:
    """Local model folders only (over HTTP inspect reads headers; a drafter folder has no
    tokenizer or backbone of its own)."""
    from ..checkpoint.store import LocalStore

    if not isinstance(ctx.store, LocalStore) or not ctx.holds_backbone:
        return []
    return folder_findings(ctx.cat)
