"""`[store] compression` and its per-source override (ckptvault/config.py)."""

from __future__ import annotations

import pytest

from ckptvault.config import ConfigError, parse_config

STORE = '[store]\nbucket = "ckpts"\n'


def test_off_by_default_and_a_source_wins_over_the_store() -> None:
    assert parse_config(STORE).store.compression == "off"
    cfg = parse_config(
        STORE + 'compression = "auto"\n'
        '[[sources]]\nrun = "a"\npath = "/x"\ncompression = "off"\n'
        '[[sources]]\nrun = "b"\npath = "/y"\n'
    )
    assert (cfg.compression_for("a"), cfg.compression_for("b"), cfg.compression_for("gone")) == ("off", "auto", "auto")


@pytest.mark.parametrize("where", ["store", "source"])
def test_an_unknown_value_names_the_key_and_the_choices(where: str) -> None:
    source = '[[sources]]\nrun = "a"\npath = "/x"\ncompression = true\n'
    text = STORE + ('compression = "zstd"\n' if where == "store" else source)
    with pytest.raises(ConfigError) as e:
        parse_config(text, "c.toml")
    key = "store.compression" if where == "store" else "sources[0].compression"
    assert f"{key}: Input should be 'auto' or 'off'" in str(e.value), str(e.value)
