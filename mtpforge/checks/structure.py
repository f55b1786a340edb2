"""Is there a head, does the config declare it, and is its key set the one the config implies
(HF_SOURCE_CHECKPOINT, MTP_CONFIG_WITHOUT_WEIGHTS, MTP_HEAD_MISSING, MTP_WEIGHTS_WITHOUT_CONFIG, MTP_MISSING_TENSORS,
MTP_UNEXPECTED_TENSORS)."""

from __future__ import annotations

from ..families.tables import expected_head, expert_format_of, is_moe, mtp_layers_of
from ..findings import Finding, finding
from .context import InspectContext


def modules(bare_keys: list[str]) -> list[str]:
    """Module names of stored keys: a quantized triplet is one module."""
    out = set()
    for k in bare_keys:
        for sfx in (".weight", ".scales", ".biases"):
            if k.endswith(sfx):
                out.add(k[: -len(sfx)])
                break
        else:
            out.add(k)
    return sorted(out)


def weighted_modules(bare_keys: list[str]) -> list[str]:
    """Modules that hold their weight: scales and biases left behind by a lost weight do not make
    one, nor does a block-FP8 release's ``<weight>_scale_inv`` or ``<module>.scale`` beside its
    ``<module>.weight`` (DeepSeek-V4's E8M0 exponents: part of its weight's module)."""
    keys = set(bare_keys)
    return modules([k for k in bare_keys if not k.endswith((".scales", ".biases", "_scale_inv"))
                    and not (k.endswith(".scale") and k.removesuffix(".scale") + ".weight" in keys)])


def check(ctx: InspectContext) -> list[Finding]:
    loc, fam, declared = ctx.loc, ctx.spec, ctx.declared
    out: list[Finding] = []
    if loc.also_found:
        out.append(finding("MTP_UNEXPECTED_TENSORS",
                           f"heads in several layouts at once: {loc.layout} and {', '.join(loc.also_found)}",
                           "keep one: `mtpforge remove-mtp` then `mtpforge add-mtp --layout …`"))
    if ctx.raw:
        out.append(_source_checkpoint(ctx))
    if not ctx.has_head:
        return out + _no_head(ctx)
    if declared == 0 and not (ctx.raw and fam.ships_head_undeclared):
        # a raw Qwen3-Next release ships its head with no count in the config (vLLM defaults
        # it to 1): that is the source as published, not a defect
        out.append(finding(
            "MTP_WEIGHTS_WITHOUT_CONFIG",
            f"{len(loc.entries)} MTP tensors are stored but the config declares no MTP layers ({' / '.join(fam.count_keys)})",
            f"set {fam.count_keys[0]} to the number of MTP layers in config.json, or re-run `mtpforge add-mtp --force`",
        ))
    bare_keys = list(loc.entries)
    fmt = expert_format_of(bare_keys, ctx.cat.config) if is_moe(ctx.cat.config) else "none"
    ctx.report["expert_format"] = fmt
    found_layers = mtp_layers_of(bare_keys, fam)
    n_layers = declared or (max(found_layers) + 1 if found_layers else 1)
    ctx.expected = expected_head(ctx.cat.config, n_layers, fmt if fmt != "none" else None, present=bare_keys,
                                 parts=ctx.stored_parts)
    stored, wanted = set(weighted_modules(bare_keys)), set(modules(list(ctx.expected)))
    missing = sorted(wanted - stored)
    unexpected = sorted(stored - wanted)
    if missing:
        out.append(finding(
            "MTP_MISSING_TENSORS", f"{len(missing)} MTP tensor(s) the config implies are missing (e.g. {missing[0]})",
            f"re-create the head: {ctx.add_fix} --force",
        ))
    if unexpected:
        out.append(finding(
            "MTP_UNEXPECTED_TENSORS",
            f"{len(unexpected)} MTP tensor(s) the config does not imply (e.g. {unexpected[0]})",
            f"remove the stray tensors or re-create the head: {ctx.add_fix} --force",
        ))
    return out


def _source_checkpoint(ctx: InspectContext) -> Finding:
    """An original Hugging Face checkpoint is what add-mtp reads, not a broken MLX folder: say so,
    and what to run with it (for a family written for llama.cpp only: into a GGUF trunk)."""
    norms = "its RMSNorms are zero-centred by design" if ctx.spec.norm_roles else "its RMSNorms are raw, as MLX uses them"
    if not ctx.spec.gguf_only:
        fix = (f"put its head into your MLX conversion: mtpforge add-mtp --source {ctx.target} --target <your MLX folder>; "
               f"or convert it with the head kept: mtpforge convert --hf-path {ctx.target} --mlx-path <new folder> -q")
    else:
        fix = f"put its head into your llama.cpp GGUF: mtpforge add-mtp --source {ctx.target} --target <trunk>.gguf"
    return finding("HF_SOURCE_CHECKPOINT",
                   f"an original Hugging Face checkpoint (unconverted keys; {norms}): a source for add-mtp, "
                   "not an MLX model folder", fix)


def _no_head(ctx: InspectContext) -> list[Finding]:
    if ctx.declared > 0:
        return [finding(
            "MTP_CONFIG_WITHOUT_WEIGHTS",
            f"config declares {ctx.declared} MTP layer(s) but the folder holds no MTP tensors "
            + ("(mlx_lm.convert drops them)" if ctx.spec.layouts else "(the conversion that made it dropped them)"),
            ctx.add_fix,
        )]
    if ctx.spec.ships_head_undeclared:
        return [finding(
            "MTP_HEAD_MISSING", f"no MTP head; {ctx.family} releases ship one, so speculative decoding with it is unavailable",
            ctx.add_fix,
        )]
    return []
