"""What a layout row says: where one runtime wants a family's head, and what else it edits.

A layout is data (one module per layout builds a :class:`LayoutSpec`); the pipeline asks the
:class:`Placement` of (layout, family) instead of comparing names. An output that is not an MLX
folder (GGUF) is a new ``kind``, with its own writer, beside these rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable

from ..families.spec import FamilySpec, Role


class LayoutName(str, Enum):
    """Where add-mtp can put a head (docs/CONTRACT.md ``--layout``)."""

    EMBEDDED = "embedded"
    SIDECAR = "sidecar"
    VLLM_MLX = "vllm-mlx"
    MLX_VLM_DRAFTER = "mlx-vlm-drafter"


@dataclass(frozen=True)
class Placement:
    """Where one layout puts one family's head, and which side files it writes."""

    layout: str
    #: the head file, relative to the written folder
    file: str
    #: key prefix of the head's tensors in that file
    prefix: str
    #: the head's keys are listed in ``model.safetensors.index.json``
    in_index: bool
    #: prefix of the module paths the runtime builds (its per-path quantization keys)
    module_prefix: str
    #: config keys (text-config level) that announce the MTP layer count, in the order written
    count_keys: tuple[str, ...] = ()
    #: the head goes into a separate folder beside the target (mlx-vlm drafter)
    separate_folder: bool = False
    #: config.json references the head file (``mlx_lm_extra_tensors``)
    sidecar_reference: bool = False
    #: ``mtp/manifest.json`` for vllm-mlx is written beside the head
    vllm_manifest: bool = False
    #: the first appended layer's index where each MTP step is a layer of its own
    #: (``Topology.appended_steps``): a bare ``{i}.rest`` is stored as ``prefix + (N + i).rest``,
    #: so Step-3.5's step 1 lands at ``model.layers.{N+1}.`` as released; None: ``prefix + bare``
    first_step: int | None = None
    #: (bare module, stored name) where the runtime holds a module under another name
    renames: tuple[tuple[str, str], ...] = ()
    #: (part role, module path) of each tensor stored split as its runtime holds it (MLA's
    #: ``kv_b_proj`` as mlx-vlm's GLM-5 drafter: ``FamilySpec.mlx_layer_parts``, passes/mla.py)
    parts: tuple[tuple[Role, str], ...] = ()
    #: head roles the runtime takes from the target instead (not written)
    skip_roles: frozenset[Role] = frozenset()

    def key(self, bare: str) -> str:
        """The stored key (or module path) of a bare head key in this placement."""
        if self.first_step is None:
            return self.prefix + dict(self.renames).get(bare, bare)
        step, rest = bare.split(".", 1)
        return f"{self.prefix}{self.first_step + int(step)}.{rest}"

    def bare_of(self, stored: str) -> str | None:
        """The bare head key of a key this placement stores (:meth:`key` undone), None for a key
        without its prefix."""
        if not stored.startswith(self.prefix):
            return None
        rest = stored[len(self.prefix):]
        for bare, name in self.renames:
            if rest == name or rest.startswith(name + "."):
                return bare + rest[len(name):]
        return rest

    def module_path(self, bare_module: str) -> str:
        """The module path a runtime builds for a head module (bare, no ``.weight``) — the key its
        loader looks up in ``config["quantization"]`` (docs/SPEC.md §4: paths after sanitize)."""
        if self.first_step is None:
            return self.module_prefix + bare_module
        return replace(self, prefix=self.module_prefix).key(bare_module)


@dataclass(frozen=True)
class LayoutSpec:
    """One layout: its name and how it places a family's head."""

    name: str
    #: the runtime that reads this layout (a row of ``runtimes.RUNTIMES``): its expert formats
    #: and quantization predicate decide what add-mtp writes
    runtime: str
    #: (family) -> Placement; raises ``ValueError`` for a family the layout does not serve
    place: Callable[[FamilySpec], Placement]
    #: the head goes into its own folder beside the target (known before the family is)
    separate_folder: bool = False
    #: the folder it writes holds a backbone (a separate drafter folder does not: nothing to verify)
    has_backbone: bool = True
    #: its runtime loads MoE experts in the source format (per-expert / fused)
    source_experts: bool = True
