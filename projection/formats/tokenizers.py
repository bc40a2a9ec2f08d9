"""Offline table of tokenizer lengths: `len(tokenizer)` (unpadded, special/added tokens included) by name.

Megatron-LM pads the vocabulary it gets from the tokenizer, not the HF config's `vocab_size` (config-formats.md §1.3),
so a loader that works offline needs the tokenizer's own length. The lookup accepts HF repo ids
('meta-llama/Llama-3.1-70B'), Primus / Megatron tokenizer-type aliases ('Llama3Tokenizer', 'GPT2BPETokenizer') and
paths of well-known tokenizer files ('.../nemotron_2_256k.model', '.../gpt2-vocab.json'), case-insensitively.

Sources (config-formats.md §2.3 table unless noted):
* Llama-2: 32000 (HF meta-llama/Llama-2-7b-hf config vocab_size 32000; the SentencePiece model has 32000 pieces).
* Llama-3 / 3.1 / 3.2 / 3.3: 128256 (128000 BPE ranks + 256 reserved special tokens; HF config vocab_size 128256).
* Mixtral-8x7B v0.1 and Mistral-7B v0.1/v0.2: 32000 (HF config vocab_size 32000).
* Qwen2.5: 151665 (config-formats.md §1.3: "Qwen2.5 gives 151665"; the HF config's 151936/152064 is padded).
* Qwen3: 151669 (§2.3: from a Qwen3-Coder report, probably shared by the family; unverified for every size).
* DeepSeek-V3 / R1: 129280, the HF config vocab_size, used as a safe upper value. The exact len(tokenizer) is not
  checked: §2.3 only bounds it to 128001..129280 (Megatron's DeepSeek-R1 recipe pads with divisor 1280 to 129280).
  Taking the upper end can over-count the embedding by at most 1279 rows, never under-count it.
* DeepSeek-V2 / V2-Lite: 102400, the HF config vocab_size, also an upper value (DeepSeek's 100K-BPE tokenizers report
  len() = 100015 for DeepSeekMoE per deepseek-ai/DeepSeek-MoE issue #14; not checked for V2).
* GPT-2 BPE: 50257 (the gpt2-vocab.json / merges pair used by Megatron's GPT2BPETokenizer; §1.11: 50257 -> 51200 at
  TP 8).
* Nemotron 256k SentencePiece (nemotron_2_256k.model): 256000 (§1.11 Megatron test input; the name gives the size;
  Megatron's GPTSentencePieceTokenizer adds no tokens to the SentencePiece model).
"""

from __future__ import annotations

import re

# (pattern searched in the lower-cased name or path, len(tokenizer)). First match wins, so more specific entries come
# first. `(?![0-9])` keeps 'llama-3' from matching 'llama-30b' (LLaMA-1 30B, a 32000 vocabulary).
_TABLE: tuple[tuple[re.Pattern[str], int], ...] = tuple(
    (re.compile(pattern), size)
    for pattern, size in (
        (r"deepseek[-_ ]?(v3|r1)(?![0-9])", 129280),
        (r"deepseek[-_ ]?v2(?![0-9])", 102400),
        (r"qwen[-_ ]?3(?![0-9.])", 151669),
        (r"qwen[-_ ]?2(\.|_|p)5", 151665),
        (r"llama[-_ ]?3(?![0-9])", 128256),
        (r"llama[-_ ]?2(?![0-9])", 32000),
        (r"mixtral[-_ ]?8x22b", 32768),  # v0.1 tokenizer v3: HF config vocab_size 32768
        (r"mixtral", 32000),
        (r"mistral[-_ ]?7b[-_ ]?v0[._]?[12](?![0-9])", 32000),
        (r"nemotron[-_ ]?\d*[-_ ]?256k", 256000),
        (r"gpt[-_ ]?2", 50257),
    )
)


def tokenizer_vocab_size(name_or_path: str) -> int | None:
    """len(tokenizer) for a known tokenizer name, HF repo id, alias or tokenizer-file path; None if unknown.

    The count is unpadded (Megatron pads it with make_vocab_size_divisible_by x TP afterwards)."""
    text = name_or_path.strip().lower()
    if not text:
        return None
    for pattern, size in _TABLE:
        if pattern.search(text):
            return size
    return None
