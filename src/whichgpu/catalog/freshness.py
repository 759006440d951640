"""How old a price is, and whether it is too old to act on.

Prices move weekly, and a shipped snapshot ages from the day it is released. Every answer that
uses a price shows its date; this module says how many days old it is and whether it is
*stale*: older than a threshold that depends on its kind (cloud rates move faster than street
prices). The thresholds default to ``DEFAULT_CLOUD_DAYS`` and ``DEFAULT_STREET_DAYS``, and are
set for a process by ``--stale-after DAYS`` (``set_stale_after``) or ``$WHICHGPU_STALE_AFTER``
(``DAYS`` for both kinds, or ``CLOUD,STREET``). A launch price (MSRP) is judged as a street
price. ``REFRESH_HINT`` says how to get fresher prices.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from whichgpu.errors import UsageError
from whichgpu.schema import Price
from whichgpu.settings import stale_after_setting

DEFAULT_CLOUD_DAYS = 90
"""Cloud rates older than this many days are stale (providers change them every few weeks)."""
DEFAULT_STREET_DAYS = 180
"""Street (new, used) and launch prices older than this many days are stale."""

REFRESH_HINT = (
    "refresh cloud rates with `whichgpu prices update` (pip install 'whichgpu[live-prices]'), "
    "or give today's prices in a price file (--prices, see docs/prices.md)"
)
"""What a stale price's note tells the user to do."""


@dataclass(frozen=True)
class StalePolicy:
    """When a price counts as stale."""

    cloud_days: int = DEFAULT_CLOUD_DAYS
    """Days after which a cloud rate (on-demand or spot) is stale."""
    street_days: int = DEFAULT_STREET_DAYS
    """Days after which a new, used or launch price is stale."""
    today: dt.date | None = None
    """The day ages are counted to (None: the system's today); fixed in tests."""

    def threshold(self, price: Price) -> int:
        """The age in days after which ``price`` is stale."""
        return self.cloud_days if price.per == "hour" else self.street_days

    def age_days(self, price: Price) -> int:
        """Days from the price's date to today (0 for a price dated today)."""
        return max(0, ((self.today or dt.date.today()) - price.as_of).days)

    def is_stale(self, price: Price) -> bool:
        """Whether ``price`` is older than its kind's threshold."""
        return self.age_days(price) > self.threshold(price)

    def age_note(self, price: Price) -> str:
        """``212 days old`` or ``212 days old, stale (over 180)``."""
        age = self.age_days(price)
        if self.is_stale(price):
            return f"{age:,} days old, STALE (over {self.threshold(price)})"
        return f"{age:,} days old"


_override: StalePolicy | None = None


def parse_stale_after(text: str) -> tuple[int, int]:
    """``"90"`` (both kinds) or ``"90,180"`` (cloud, street) as (cloud days, street days)."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        days = [int(p) for p in parts]
    except ValueError:
        days = []
    if len(days) not in (1, 2) or any(d < 0 for d in days):
        raise UsageError(
            f"--stale-after: '{text}' is not a number of days (DAYS for every price, or "
            "CLOUD,STREET such as 90,180)."
        )
    return (days[0], days[-1])


def set_stale_after(text: str | None, *, today: dt.date | None = None) -> StalePolicy:
    """Set this process's thresholds from ``--stale-after`` (None: back to the default)."""
    global _override
    if text is None:
        _override = None if today is None else replace(stale_policy(), today=today)
    else:
        cloud, street = parse_stale_after(text)
        _override = StalePolicy(cloud_days=cloud, street_days=street, today=today)
    return stale_policy()


def stale_policy() -> StalePolicy:
    """The thresholds in force: ``set_stale_after``, else ``$WHICHGPU_STALE_AFTER``, else the
    defaults."""
    if _override is not None:
        return _override
    env = stale_after_setting()
    if env:
        cloud, street = parse_stale_after(env)
        return StalePolicy(cloud_days=cloud, street_days=street)
    return StalePolicy()


def stale_note(prices: list[Price] | tuple[Price, ...]) -> str | None:
    """One sentence on the stale prices an answer used, with how to refresh them; None if
    none is stale."""
    policy = stale_policy()
    stale = [p for p in prices if p is not None and policy.is_stale(p)]
    if not stale:
        return None
    oldest = min(p.as_of for p in stale)
    return (
        f"{len(stale)} price(s) used here are older than {policy.cloud_days} days (cloud) or "
        f"{policy.street_days} days (street), the oldest from {oldest}: {REFRESH_HINT}; "
        "--stale-after DAYS sets the thresholds."
    )
