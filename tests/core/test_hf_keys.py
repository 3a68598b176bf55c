"""HFKeys' record of what a config.json import read and ignored, and errors that name the key."""

from __future__ import annotations

import dataclasses

import pytest

from stage_core.errors import UsageError
from stage_core.models import HFKeys, ModelConfig, check_divides, check_int, hf_import_of, keep_hf_import


@dataclasses.dataclass(frozen=True)
class Cfg(ModelConfig):
    name: str = "c"
    family: str = "test"
    heads: int = 4
    groups: int = 2
    seq_len: int = 64

    def __post_init__(self):
        check_int(self, "heads", "groups")
        check_divides(self, "groups", "heads")


DATA = {"model_type": "x", "num_heads": 4, "n_groups": 2, "rope_theta": 1e4, "initializer_range": 0.02,
        "text_config": {"hidden_size": 8, "vocab_size": 16, "rope_scaling": None}}


def test_unread_keys_are_the_ignored_ones():
    r = HFKeys(DATA)
    text = r.child("text_config")
    text.int("hidden_size")
    config = r.make(Cfg, {"heads": r.int("num_heads"), "groups": r.int("n_groups")})
    assert hf_import_of(config) == {"source": "config.json", "model_type": "x",
                                    "ignored_keys": ["initializer_range", "rope_theta", "text_config.rope_scaling",
                                                     "text_config.vocab_size"]}
    # not a field: the config's value, dict and equality are unchanged, and --set keeps the record
    assert config == Cfg(heads=4, groups=2) and "_hf_import" not in config.to_dict()
    assert hf_import_of(keep_hf_import(config, config.replace(seq_len=32)))["ignored_keys"][0] == "initializer_range"
    assert hf_import_of(Cfg()) is None


def test_config_checks_name_the_key_behind_the_field():
    r = HFKeys({**DATA, "n_groups": 3})
    with pytest.raises(UsageError) as info:
        r.make(Cfg, {"heads": r.int("num_heads"), "groups": r.int("n_groups")}, keys={"groups": "n_groups"})
    assert str(info.value) == "config.json: key 'n_groups': Cfg groups=3 does not divide heads=4"


def test_every_alias_present_is_checked():
    r = HFKeys({"n_positions": 1024, "n_ctx": -1})
    with pytest.raises(UsageError, match="'n_ctx'"):
        r.int("n_positions", or_keys=("n_ctx",))
    assert HFKeys({"n_ctx": 512}).int("n_positions", or_keys=("n_ctx",)) == 512


def test_a_child_must_be_an_object():
    with pytest.raises(UsageError, match="'text_config'"):
        HFKeys({"text_config": 3}).child("text_config")
