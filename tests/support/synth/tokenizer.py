"""A real byte-level BPE tokenizer, trained in milliseconds, that transformers and mlx-lm load
offline exactly as they load a Qwen tokenizer (tokenizer.json + tokenizer_config.json)."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Iterable

from .config import SPECIAL_TOKENS

#: Qwen3.5's pre-tokenizer split (transformers' tokenization_qwen3_5.PRETOKENIZE_REGEX)
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_SUBJECTS = ("the cat", "a dog", "the robot", "my friend", "the teacher", "a bird", "the model",
             "our team", "the river", "a small boat", "the old man", "the engine")
_VERBS = ("sees", "likes", "builds", "counts", "follows", "paints", "finds", "carries", "reads",
          "moves", "opens", "measures")
_OBJECTS = ("the red ball", "a green tree", "three apples", "the long road", "a blue house",
            "the quiet lake", "seven stones", "the bright star", "a wooden box", "the map")
_PLACES = ("in the garden", "near the station", "at noon", "after the rain", "on the hill",
           "before dinner", "under the bridge", "in the city")


def default_corpus(n: int = 1500, seed: int = 0) -> list[str]:
    """A deterministic templated corpus: sentences, counting, arithmetic and a little code,
    regular enough that a tiny model can learn it and a drafter can predict it."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(n):
        r = i % 5
        if r == 0:
            out.append(f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_PLACES)}.")
        elif r == 1:
            a = rng.randrange(1, 50)
            out.append("Count: " + ", ".join(str(a + k) for k in range(6)) + ".")
        elif r == 2:
            a, b = rng.randrange(1, 100), rng.randrange(1, 100)
            out.append(f"{a} + {b} = {a + b}. {a} times 2 is {2 * a}.")
        elif r == 3:
            name = rng.choice(("total", "value", "count", "index", "result"))
            out.append(f"def add_{name}(x, y):\n    {name} = x + y\n    return {name}\n")
        else:
            s = rng.choice(_SUBJECTS)
            out.append(f"<|im_start|>user\nWhat does {s} do?<|im_end|>\n<|im_start|>assistant\n"
                       f"{s.capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}.<|im_end|>\n")
    return out


def build_tokenizer(texts: Iterable[str] | None, vocab_size: int, folder: str | Path) -> None:
    """Train a byte-level BPE on ``texts`` (default: ``default_corpus()``) with at most
    ``vocab_size`` tokens and save it into ``folder``. Special tokens take ids 0..6 (see
    ``config.SPECIAL_TOKENS``); eos is ``<|im_end|>`` (id 2), pad ``<|endoftext|>`` (id 0).
    Output is byte-identical for identical inputs."""
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level BPE (>= {len(SPECIAL_TOKENS) + 256})")
    if texts is None:
        tokenizer_json = _trained_default(vocab_size)
    else:
        tokenizer_json = _train(list(texts), vocab_size)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(), indent=2) + "\n", encoding="utf-8")


@functools.lru_cache(maxsize=8)
def _trained_default(vocab_size: int) -> str:
    return _train(default_corpus(), vocab_size)


def _train(texts: list[str], vocab_size: int) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # Exactly the pipeline of transformers' Qwen3_5Tokenizer, which AutoTokenizer substitutes
    # for any tokenizer.json in a qwen3_5 folder (keeping vocab and merges): training with the
    # same pipeline makes source and converted folders tokenize identically.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() > vocab_size:  # cannot happen with the byte alphabet checked above
        raise ValueError(f"trained {tok.get_vocab_size()} tokens, more than vocab_size {vocab_size}")
    return tok.to_str(pretty=True)


def _tokenizer_config() -> dict:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
