"""The tokenizers tml-renderers bundles, behind the Hugging Face tokenizer methods tinkrl calls.

tml-renderers ships each family's tokenizer inside the package (no download, no hub), so the
renderers it implements work offline, and so does any model of those families whose HF tokenizer
is not on disk: `BundledTokenizer` gives them the `encode` / `decode` / `convert_tokens_to_ids`
surface of an HF tokenizer. As with an HF tokenizer, a special token written in the text
(`<|im_end|>`) encodes to its id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


class BundledTokenizer:
    """A tml-renderers tokenizer with the HF tokenizer methods the renderers and servers call."""

    unk_token_id = None

    def __init__(self, tml_tokenizer: Any, name_or_path: str = ""):
        self.tml = tml_tokenizer
        self.name_or_path = name_or_path
        self.specials: dict[str, int] = {}  # text -> id, e.g. "<|im_end|>" -> 151645
        for name in tml_tokenizer.special_tokens():
            tid = tml_tokenizer.encode_special(name)
            self.specials[tml_tokenizer.decode([tid])] = tid
        longest_first = sorted(self.specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(s) for s in longest_first) + ")")
        self.bos_token = self._special_text(tml_tokenizer.bos_token)
        self.eos_token = self._special_text(tml_tokenizer.eos_token)
        self.bos_token_id = self.specials.get(self.bos_token) if self.bos_token else None
        self.eos_token_id = self.specials.get(self.eos_token) if self.eos_token else None
        self._size: int | None = None

    def _special_text(self, name: str) -> str | None:
        return self.tml.decode([self.tml.encode_special(name)]) if name else None

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        """Token ids of `text`; special tokens written in it become their ids (no BOS is added)."""
        out: list[int] = []
        for part in self._split.split(text):
            if part in self.specials:
                out.append(self.specials[part])
            elif part:
                out += self.tml.encode_ordinary(part)
        return out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False, **_: Any) -> str:
        """Text of token ids (special tokens written out unless skipped)."""
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if not self.tml.is_special_token(i)]
        return self.tml.decode(ids)

    def convert_tokens_to_ids(self, token: str | list[str]) -> Any:
        """The id of a special token's text (None when it is not one); a list maps element-wise."""
        if isinstance(token, list):
            return [self.convert_tokens_to_ids(t) for t in token]
        if token in self.specials:
            return self.specials[token]
        ids = self.tml.encode_ordinary(token)
        return ids[0] if len(ids) == 1 else None

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(self.specials.values())

    def __len__(self) -> int:
        """The vocabulary size: one past the largest id the tokenizer decodes."""
        if self._size is None:
            lo, hi = max(self.specials.values()), 1 << 22  # lo decodes; hi does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self._decodes(mid) else (lo, mid)
            self._size = hi
        return self._size

    def _decodes(self, token_id: int) -> bool:
        try:
            self.tml.decode_bytes([token_id])
        except ValueError:
            return False
        return True

    def __call__(self, text: str, add_special_tokens: bool = False, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}
