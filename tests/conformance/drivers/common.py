"""What every conformance driver shares. Runs inside a runtime's own virtualenv: standard library
and mlx only, never mtpforge (the runtimes pin an mlx-lm that mtpforge's environment cannot hold).

A driver loads one folder with the runtime's own loader and decodes with the runtime's own loop.
What this module adds is observation, never behaviour:

- ``LoadLog`` wraps ``mlx.nn.Module.load_weights`` to write down what each call offered and what
  the receiving module holds, then calls the original. The runtimes load the head with
  ``strict=False``, which silently ignores unknown keys and leaves missing parameters at their
  initial values; the log shows both, as ``strict=True`` would have.
- ``compare_loaded`` compares the head's parameters after loading with the tensors in the file,
  key by key where the names match, so a norm the runtime re-shifted or a tensor it rewrote shows
  up as a value difference.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable


class Head:
    """How the family under test spells its head, as the harness read it from the family spec
    (``mtpforge.families``: this process cannot import mtpforge) and put in the driver's spec
    as ``head``: ``prefixes`` (stripped from stored keys to get bare ones), ``mark`` (the bare
    key of the hidden-state norm every head has: a load call offering it loads a head),
    ``norms`` (the norm kinds' key endings, checked for value equality after loading) and
    ``embed`` (the backbone embedding's module name: a load offering it loads the whole model)."""

    prefixes: tuple[str, ...] = ()
    mark = ""
    norms: tuple[str, ...] = ()
    embed = ""
    #: ``[stem, N]`` for a head of appended layers (Step-3.5): ``stem{N+i}.rest`` reads as
    #: ``{i}.rest``, the family's bare spelling; None otherwise
    steps: list[Any] | None = None

    @classmethod
    def configure(cls, head: dict[str, Any]) -> None:
        cls.steps = head.get("steps")
        cls.prefixes = tuple(head["prefixes"])
        cls.mark = head["mark"]
        cls.norms = tuple(head["norms"])
        cls.embed = head["embed"]

    @classmethod
    def is_mark(cls, key: str) -> bool:
        """The head's mark, bare or as a runtime nests it (MTPLX's ``layers.0.`` for GLM)."""
        rel = relative_head_key(key)
        return rel == cls.mark or rel.endswith("." + cls.mark.rsplit(".", 2)[-2] + ".weight")


def _shapes(pairs: Any) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in pairs}


class LoadLog:
    """Records ``load_weights`` calls (see module docstring). Use as a context manager."""

    def __enter__(self) -> "LoadLog":
        import mlx.core as mx
        import mlx.nn as nn
        from mlx.utils import tree_flatten

        self.calls: list[dict[str, Any]] = []
        self._orig = orig = nn.Module.load_weights
        log = self

        def recorded(mod: Any, file_or_weights: Any, strict: bool = True) -> Any:
            if isinstance(file_or_weights, (str, Path)):
                offered = _shapes(mx.load(str(file_or_weights)).items())
            else:
                items = list(file_or_weights.items()) if isinstance(file_or_weights, dict) else list(file_or_weights)
                file_or_weights = items
                offered = _shapes(items)
            params = _shapes(tree_flatten(mod.parameters()))
            log.calls.append({"module": type(mod).__name__, "strict": bool(strict), "offered": offered,
                              "params": params, "obj": mod})
            return orig(mod, file_or_weights, strict=strict)

        nn.Module.load_weights = recorded
        return self

    def __exit__(self, *exc: Any) -> None:
        import mlx.nn as nn

        nn.Module.load_weights = self._orig

    def head_calls(self) -> list[dict[str, Any]]:
        """The calls that loaded an MTP head (the offered keys hold the head's mark and no
        backbone embedding), plus any later call on a sub-module of that head (runtimes that
        patch experts in afterwards)."""
        out, heads = [], []
        for c in self.calls:
            # a whole-model load that merely carries mtp.* keys (and so embed_tokens) is not one
            if any(Head.is_mark(k) for k in c["offered"]) and \
                    not any(Head.embed in k.split(".") for k in c["offered"]):
                heads.append(c["obj"])
                out.append(c)
            elif heads and any(_contains(h, c["obj"]) for h in heads):
                out.append(c)
        return out


def _contains(root: Any, obj: Any) -> bool:
    import mlx.nn as nn

    found = False

    def visit(_path: str, m: Any) -> None:
        nonlocal found
        if m is obj:
            found = True

    if isinstance(root, nn.Module):
        root.apply_to_modules(visit)
    return found


def load_report(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Missing / unexpected / mis-shaped keys of the head's load calls, as strict loading would
    report them; empty lists mean every tensor in the file landed in a parameter of its shape."""
    if not calls:
        return {"calls": 0, "offered": 0, "params": 0, "missing": [], "unexpected": [], "misshaped": []}
    main = calls[0]
    offered, params = main["offered"], main["params"]
    later = [c for c in calls[1:]]
    return {
        "calls": len(calls),
        "strict": main["strict"],
        "offered": len(offered),
        "params": len(params),
        "missing": sorted(k for k in params if k not in offered),
        "unexpected": sorted(k for k in offered if k not in params),
        "misshaped": sorted(k for k in offered if k in params and offered[k] != params[k]),
        "patched_afterwards": sorted(k for c in later for k in c["offered"]),
    }


def relative_head_key(key: str) -> str:
    if Head.steps is not None:
        stem, first = Head.steps
        layer, _, rest = key[len(stem):].partition(".")
        if key.startswith(stem) and layer.isdigit() and int(layer) >= first:
            return f"{int(layer) - first}.{rest}"
        return key
    for p in Head.prefixes:
        if key.startswith(p):
            return key[len(p):]
    return key


def _by_renamed_key(loaded: dict[str, Any], on_disk: dict[str, Any]) -> dict[str, str]:
    """loaded name -> file name for a runtime that renames every key (MTPLX's GLM head:
    ``layers.0.mtp_block.self_attn.q_proj`` for ``self_attn.q_proj``, ``shared_head_norm`` for
    ``shared_head.norm``): the longest file name that ends the loaded one, dots and underscores
    alike. A parameter the runtime builds from several tensors (MLA's split ``kv_b_proj``) has
    none and is not compared."""
    flat = {k.replace(".", "_"): k for k in on_disk}
    out = {}
    for name in loaded:
        n = name.replace(".", "_")
        hits = [f for f in flat if n == f or n.endswith("_" + f) or _same_step(n, f)]
        if hits:
            out[name] = flat[max(hits, key=len)]
    return out


def _same_step(loaded: str, stored: str) -> bool:
    """A head of appended layers (Step-3.5): MTPLX nests step i's decoder block as
    ``layers.{i}.mtp_block.<rest>``, the file says ``{i}.<rest>`` (underscored alike)."""
    step, _, rest = stored.partition("_")
    return Head.steps is not None and step.isdigit() and loaded.startswith(f"layers_{step}_") \
        and loaded.endswith("_" + rest)


def compare_loaded(head: Any, files: list[Path]) -> dict[str, Any]:
    """Compare the loaded head's parameters with the file's tensors of the same relative name."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    on_disk: dict[str, Any] = {}
    for f in files:
        for k, v in mx.load(str(f)).items():
            on_disk[relative_head_key(k)] = v
    loaded = dict(tree_flatten(head.parameters()))
    names = {k: k for k in loaded if k in on_disk}
    if not names:  # the runtime renamed every key
        names = _by_renamed_key(loaded, on_disk)
    same, differ, norms = 0, [], {}
    for k, v in loaded.items():
        w = on_disk.get(names.get(k, k))
        if w is None or tuple(w.shape) != tuple(v.shape):
            continue
        if v.dtype == mx.uint32 or w.dtype == mx.uint32:
            equal = v.dtype == w.dtype and bool(mx.array_equal(v, w).item())
            diff = 0.0 if equal else float("inf")
        else:
            diff = float(mx.max(mx.abs(v.astype(mx.float32) - w.astype(mx.float32))).item())
            equal = diff == 0.0
        if k.endswith(Head.norms):
            norms[k] = {"file_mean": float(mx.mean(w.astype(mx.float32)).item()),
                        "loaded_mean": float(mx.mean(v.astype(mx.float32)).item())}
        if equal:
            same += 1
        else:
            differ.append({"key": k, "max_abs_diff": diff})
    return {"compared": same + len(differ), "equal": same, "differ": differ,
            "norms_as_written": all(abs(n["file_mean"] - n["loaded_mean"]) < 1e-6 for n in norms.values())
            if norms else None, "norms": norms}


def main(cell: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], None],
         bare: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
    """``driver.py SPEC_JSON OUT_JSON``. SPEC names several folders of one runtime and family
    (one interpreter start and one runtime import serve them all): ``cell(spec, entry, out)``
    loads and decodes ``entry["folder"]`` into ``out``; ``bare(spec, out)`` decodes the folder
    without a head. A result is written even when the runtime failed part-way (the failure is
    the measurement; only a broken driver exits non-zero)."""
    spec = json.loads(Path(sys.argv[1]).read_text())
    out_file = Path(sys.argv[2])
    Head.configure(spec["head"])
    results: dict[str, Any] = {"cells": {}}
    for entry in spec["cells"]:
        t0 = time.monotonic()
        out: dict[str, Any] = {"ok": True}
        try:
            cell(spec, entry, out)
        except RuntimeFailure as e:
            out.update(ok=False, stage=e.stage, error=e.message)
        out["seconds"] = round(time.monotonic() - t0, 2)
        results["cells"][entry["id"]] = out
    if spec.get("bare"):
        t0 = time.monotonic()
        out = {"ok": True}
        try:
            bare(spec, out)
        except RuntimeFailure as e:
            out.update(ok=False, stage=e.stage, error=e.message)
        out["seconds"] = round(time.monotonic() - t0, 2)
        results["bare"] = out
    out_file.write_text(json.dumps(results, indent=1, default=str))


class RuntimeFailure(Exception):
    """The runtime itself refused or crashed; carries its own words and the stage it failed at."""

    def __init__(self, stage: str, exc: BaseException) -> None:
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" ({Path(last.filename).name}:{last.lineno})" if last else ""
        self.stage = stage
        self.message = f"{type(exc).__name__}: {exc}"[:400] + where
        super().__init__(self.message)


def stage(name: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # the runtime's own failure is the result
        raise RuntimeFailure(name, e) from e


#: where each layout keeps the head, relative to the folder a runtime is given
HEAD_FILES = ("mtp.safetensors", "mtp/weights.safetensors", "model-mtp.safetensors", "model.safetensors")


def head_files(folder: Path) -> list[Path]:
    """The files in ``folder`` that can hold MTP tensors (whichever layout wrote them)."""
    import mlx.core as mx

    out = []
    for rel in HEAD_FILES:
        p = folder / rel
        if p.is_file() and any(relative_head_key(k) == Head.mark for k in mx.load(str(p))):
            out.append(p)
    return out
