"""BERT presets: Devlin et al. 2019, Table/section 3 (BERT-BASE: L 12, H 768, A 12; BERT-LARGE:
L 24, H 1024, A 16), the uncased WordPiece vocabulary of 30,522 tokens, 512 positions, two
token types (Hugging Face's bert-base-uncased and bert-large-uncased config.json)."""

from __future__ import annotations

from types import MappingProxyType

from .model import BertConfig

PRESETS = MappingProxyType({
    "bert-base": BertConfig(name="bert-base", layers=12, hidden=768, heads=12, ffn_hidden=3072),
    "bert-large": BertConfig(name="bert-large", layers=24, hidden=1024, heads=16, ffn_hidden=4096),
    "bert-tiny": BertConfig(name="bert-tiny", layers=2, hidden=128, heads=2, ffn_hidden=512, seq_len=128),
})
