"""Whole-folder findings beyond the head: what makes a model folder fail to load or to stop.

A generic checker catches these on any MLX folder, so inspect must too: a quantized module whose
stored shapes contradict the bits/group the config makes the loader build, a tokenizer that is
missing or cannot be read, eos/pad ids that disagree between config, generation_config and
tokenizer, and a missing chat template. Local folders only (over HTTP inspect reads headers).
Each check is a small function from what it reads to findings (docs/FINDINGS.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from ..checkpoint.catalogue import Catalogue
from ..checkpoint.store import Store
from ..families.tables import is_head_key
from ..findings import ERROR, Finding, finding
from ..inputs.model_config import ModelConfig
from ..inputs.side_files import GENERATION_CONFIG, TOKENIZER_CONFIG, GenerationConfig, TokenizerConfig, read_side_file
from ..layouts.quant import module_quant
from ..passes.quantize import QSpec

if TYPE_CHECKING:
    from .context import InspectContext

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def quantized_shape_findings(cat: Catalogue) -> list[Finding]:
    """Every quantized backbone module (``.scales`` stored) against the config's bits/group.

    ``weight`` is packed to in·bits/32 uint32 columns and ``scales`` has in/group columns, so a
    module agrees with the config iff packed·32 == scales·group·bits (and ``biases``, for affine,
    has the scales' shape). The head is checked by inspect's own MTP precision check.
    """
    default = cat.config.quant_default
    entries = module_quant(cat.config)
    tensors = cat.tensors
    bad: list[str] = []
    for key, s in tensors.items():
        if not key.endswith(".scales") or is_head_key(key, cat.config):
            continue
        path = key[: -len(".scales")]
        w = tensors.get(f"{path}.weight")
        if w is None or not w.shape or not s.shape:
            continue
        e = entries.get(path)
        if e is False:
            bad.append(f"{path}: stored quantized, config says unquantized")
            continue
        q = e if isinstance(e, QSpec) else default
        if q is None:
            bad.append(f"{path}: stored quantized, config declares no quantization")
            continue
        bits, group = q.bits, q.group_size
        if w.shape[-1] * 32 != s.shape[-1] * group * bits:
            stored_bits = w.shape[-1] * 32 / (s.shape[-1] * group) if s.shape[-1] else 0
            bad.append(f"{path}: weight {list(w.shape)} / scales {list(s.shape)} is not {bits}-bit group {group} "
                       f"(fits {stored_bits:g}-bit)")
            continue
        b = tensors.get(f"{path}.biases")
        if q.mode == "affine" and b is not None and tuple(b.shape) != tuple(s.shape):
            bad.append(f"{path}: biases {list(b.shape)} differ from scales {list(s.shape)}")
    if not bad:
        return []
    return [finding(
        "QUANT_CONFIG_MISMATCH",
        f"{len(bad)} backbone module(s) are stored at another precision than the config makes the loader build: {bad[0]}",
        "re-convert the model (mlx_lm.convert) or add a per-module entry under \"quantization\" and "
        "\"quantization_config\" in config.json",
    )]


def _ids(v: int | list[int] | None) -> set[int]:
    return set(v) if isinstance(v, list) else ({v} if v is not None else set())


def tokenizer_findings(store: Store, config: ModelConfig) -> list[Finding]:
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
    tcfg = read_side_file(store, TOKENIZER_CONFIG).value or TokenizerConfig()
    gen = read_side_file(store, GENERATION_CONFIG).value or GenerationConfig()
    if vocab is not None:
        out += _eos_pad(config, gen, tcfg, vocab)
    has_template = bool(tcfg.chat_template) or any(store.exists(f) for f in CHAT_TEMPLATE_FILES)
    if not has_template:
        out.append(finding("CHAT_TEMPLATE_MISSING", "no chat template (tokenizer_config.json chat_template or "
                           "chat_template.jinja): chat use in mlx-lm and the runtimes fails or formats wrongly",
                           "copy chat_template.jinja (or tokenizer_config.json) from the original model"))
    return out


def _eos_pad(config: ModelConfig, gen: GenerationConfig, tcfg: TokenizerConfig, vocab: Mapping[str, int]) -> list[Finding]:
    ntok = max(vocab.values(), default=-1) + 1
    declared = {
        "config.json eos_token_id": config.token_ids("eos_token_id"),
        "generation_config.json eos_token_id": _ids(gen.eos_token_id),
        "config.json pad_token_id": config.token_ids("pad_token_id"),
        "generation_config.json pad_token_id": _ids(gen.pad_token_id),
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
    eos_text, pad_text = TokenizerConfig.text(tcfg.eos_token), TokenizerConfig.text(tcfg.pad_token)
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
