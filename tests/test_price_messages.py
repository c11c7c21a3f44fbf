"""What a planner user found (2026-12-07): `--rate local=1e300/gpu-hour` was refused as "USD a number >= 0", which
it is, without the ceiling; a prices file holding `null` (valid JSON) was called "not valid JSON/YAML"."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.costs.catalog import CatalogError, load_catalog, parse_rate


def test_a_rate_over_the_ceiling_is_told_the_ceiling() -> None:
    with pytest.raises(CatalogError, match=r"a number from 0 to 10,000 \(above that a price is a typo"):
        parse_rate("local=1e300/gpu-hour")


@pytest.mark.parametrize("text", ["null", "[1, 2]", "5"])
def test_a_prices_file_of_valid_json_that_is_not_a_mapping_is_said_so(tmp_path: Path, text: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    assert "holds no mapping of prices" in str(info.value) and "not valid JSON" not in str(info.value)


def test_a_prices_file_that_is_not_json_is_still_said_so(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text("{oops")
    with pytest.raises(CatalogError, match="is not valid JSON/YAML"):
        load_catalog(path)
