"""Dollars of a study's runs: seed 004's money-speed table priced from the catalog.

The table's shape is analysis.studies.money_table (pure, given a `price` function); the price is
costs.billing.run_cost over the catalog, and each layout's instances are counted by
costs.billing.instances_for, so a study bills exactly as `launch cost` does.
"""

from __future__ import annotations

from typing import Callable, Mapping

import pandas as pd

from scalelab.analysis.studies import money_table
from scalelab.costs.billing import instances_for, run_cost
from scalelab.costs.catalog import Catalog, load_catalog

__all__ = ["study_pricer", "price_money_table"]


def study_pricer(catalog: Catalog | None = None) -> Callable[[str, float, str], float]:
    """`price(mix, seconds, market)` in dollars (to 1/100 cent): per-second billing with a 60 s
    minimum per instance. The catalog (default: built in + the user's prices file) is read once,
    not once per row."""
    catalog = catalog if catalog is not None else load_catalog()
    return lambda mix, seconds, market: round(run_cost(seconds, mix, catalog, market).dollars, 4)


def price_money_table(rows: pd.DataFrame, instances: Mapping[tuple[str, str], str | None], market: str,
                      catalog: Catalog | None = None) -> pd.DataFrame:
    """Seed 004's money-speed table of the study rows (analysis.studies.StudyRuns.rows: their `wall_s`, launch to
    the last record, and `wall_to_threshold_s` are what is billed, as `launch cost` bills a run; training seconds
    alone would under-bill the start-up); `instances` maps (variant label, layout "NxG") to the instance mix the
    layout runs on (a bare type: the instances that hold the layout, `instances_for`; an explicit mix as written)."""
    catalog = catalog if catalog is not None else load_catalog()
    counted = {(label, layout): str(instances_for(*map(int, layout.split("x")), text, catalog)) if text else text
               for (label, layout), text in instances.items()}
    return money_table(rows, counted, market, study_pricer(catalog))
