"""Bad input gets a typed error naming the field and the limit — never a silent score."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kvrank.errors import InputError
from kvrank.model.config import ModelConfig
from kvrank.model.inputs import Events


@pytest.fixture
def model(factory, tiny_cfg):
    return factory.model(tiny_cfg)


def _bad_events(factory, cfg, change):
    return replace(factory.events(cfg, 5, 1), **change)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"item_ids": torch.tensor([1, 2, -3, 4, 5])}, "events.item_ids", "negative"),
        ({"actions": torch.tensor([0, 1, 99, 0, 0])}, "events.actions", "out of range [0, 4)"),
        ({"gaps": torch.tensor([0, 1, 2])}, "events.gaps", "shape (3,)"),
        ({"dense": torch.full((5, 2), float("nan"))}, "events.dense", "NaN"),
        ({"dense": torch.full((5, 2), float("inf"))}, "events.dense", "infinite"),
        ({"categories": torch.tensor([0.0, 1, 2, 3, 4])}, "events.categories", "int64"),
    ],
)
def test_bad_events_name_the_field(factory, tiny_cfg, model, change, field, words) -> None:
    user = factory.user(tiny_cfg, 5, 1)
    bad = user.with_events(_bad_events(factory, tiny_cfg, change))
    with pytest.raises(InputError) as info:
        model.encode_user(bad)
    assert info.value.field == field
    assert words in str(info.value)


def test_empty_sequence(factory, tiny_cfg, model) -> None:
    user = factory.user(tiny_cfg, 5, 1)
    empty = user.with_events(user.events.slice(0, 0))
    with pytest.raises(InputError, match="empty"):
        model.encode_user(empty)


def test_bad_candidates(factory, tiny_cfg, model) -> None:
    kv = model.encode_user(factory.user(tiny_cfg, 5, 1))
    cands = factory.candidates(tiny_cfg, 3, 1)
    with pytest.raises(InputError, match=r"candidates.categories: id 16 is out of range \[0, 16\)"):
        model.score(kv, replace(cands, categories=torch.tensor([0, 1, 16])))
    with pytest.raises(InputError, match=r"candidates\.dense"):
        model.score(kv, replace(cands, dense=torch.zeros(3, tiny_cfg.cand_dense + 1)))
    with pytest.raises(InputError, match="no candidates"):
        model.score(kv, cands.select(slice(0, 0)))


def test_bad_new_events_for_extend(factory, tiny_cfg, model) -> None:
    kv = model.encode_user(factory.user(tiny_cfg, 5, 1))
    bad = _bad_events(factory, tiny_cfg, {"item_ids": torch.tensor([1, 2, -1, 4, 5])})
    with pytest.raises(InputError) as info:
        model.extend_user(kv, bad)
    assert info.value.field == "new_events.item_ids"


def test_bad_profile_shape(factory, tiny_cfg, model) -> None:
    user = replace(factory.user(tiny_cfg, 5, 1), profile_ids=torch.zeros(9, dtype=torch.long))
    with pytest.raises(InputError, match="profile_ids: shape"):
        model.encode_user(user)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, "not divisible"),
        ({"n_layers": 2, "pyramid": (8, 16)}, "pyramid[1]=16"),
        ({"n_layers": 2, "candidate_layers": 3}, "candidate_layers=3"),
        ({"max_events": 0}, "max_events"),
    ],
)
def test_bad_config_is_rejected(fields, message) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ModelConfig(**fields)


def test_events_type_is_checked(factory, tiny_cfg, model) -> None:
    ev = factory.events(tiny_cfg, 3, 1)
    bad = Events([1, 2, 3], ev.categories, ev.actions, ev.gaps, ev.dense)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="expected a tensor"):
        model.encode_user(factory.user(tiny_cfg, 3, 1).with_events(bad))
