"""The answers of NEXMark q0-q22, computed in plain Python over the generated events (no Spark, no headrace).

Each function takes the events and returns the query's rows as tuples, in the order of the query's
columns (``benchmarks/nexmark.py`` lists them). Times are epoch milliseconds, UTC. An event-time
window holds the events of its half-open interval ``[start, end)``, aligned on the epoch; the whole
input is taken, as a stream's answer once every window has closed.
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from benchmarks.nexmark_events import AUCTION_FIELDS, BID_FIELDS, SIDE_INPUT_ROWS, Events

Row = tuple[Any, ...]
SECOND = 1000
EUROS = Decimal("0.908")  # q1 and q14: dollars to euros
HOT_CHANNEL_IDS = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}


def utc(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def day(ms: int) -> str:
    return utc(ms).strftime("%Y-%m-%d")


def tumbling(ms: int, size: int) -> int:
    """The start of the tumbling window of ``size`` ms holding ``ms``."""
    return ms - ms % size


def sliding(ms: int, size: int, slide: int) -> Iterable[int]:
    """The starts of the sliding windows of ``size`` ms every ``slide`` ms holding ``ms``."""
    start = tumbling(ms, slide)
    while start > ms - size:
        yield start
        start -= slide


def q0(events: Events) -> list[Row]:
    return [(b["auction"], b["bidder"], b["price"], b["dateTime"], b["extra"]) for b in events.bid]


def q1(events: Events) -> list[Row]:
    return [(b["auction"], b["bidder"], EUROS * b["price"], b["dateTime"], b["extra"]) for b in events.bid]


def q2(events: Events) -> list[Row]:
    return [(b["auction"], b["price"]) for b in events.bid if b["auction"] % 123 == 0]


def q3(events: Events) -> list[Row]:
    persons = {p["id"]: p for p in events.person if p["state"] in ("OR", "ID", "CA")}
    return [(persons[a["seller"]]["name"], persons[a["seller"]]["city"], persons[a["seller"]]["state"], a["id"])
            for a in events.auction if a["category"] == 10 and a["seller"] in persons]


def winning_bids(events: Events) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each auction with a bid between its start and its end (both included), and its winning bid:
    the highest price, the earliest of equal ones."""
    auctions = {a["id"]: a for a in events.auction}
    best: dict[int, dict[str, Any]] = {}
    for b in events.bid:
        a = auctions.get(b["auction"])
        if a is None or not a["dateTime"] <= b["dateTime"] <= a["expires"]:
            continue
        held = best.get(a["id"])
        if held is None or (b["price"], -b["dateTime"]) > (held["price"], -held["dateTime"]):
            best[a["id"]] = b
    return [(auctions[i], b) for i, b in best.items()]


def q4(events: Events) -> list[Row]:
    finals: dict[int, list[int]] = defaultdict(list)
    for a, b in winning_bids(events):
        finals[a["category"]].append(b["price"])
    return [(category, sum(prices) / len(prices)) for category, prices in finals.items()]


def q5(events: Events) -> list[Row]:
    counts: Counter[tuple[int, int]] = Counter()
    for b in events.bid:
        for start in sliding(b["dateTime"], 10 * SECOND, 2 * SECOND):
            counts[start, b["auction"]] += 1
    most: dict[int, int] = defaultdict(int)
    for (start, _), n in counts.items():
        most[start] = max(most[start], n)
    return [(auction, n) for (start, auction), n in counts.items() if n >= most[start]]


def q6(events: Events) -> list[Row]:
    by_seller: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for a, b in winning_bids(events):  # in the order the auctions end: when a stream learns their winners
        by_seller[a["seller"]].append((a["expires"], a["id"], b["price"]))
    rows = []
    for seller, sales in by_seller.items():
        prices = [price for *_, price in sorted(sales)]
        for i in range(len(prices)):
            last = prices[max(0, i - 10):i + 1]  # ROWS BETWEEN 10 PRECEDING AND CURRENT ROW
            rows.append((seller, sum(last) / len(last)))
    return rows


def q7(events: Events) -> list[Row]:
    size = 10 * SECOND
    highest: dict[int, int] = defaultdict(int)
    for b in events.bid:
        start = tumbling(b["dateTime"], size)
        highest[start] = max(highest[start], b["price"])
    rows = []
    for b in events.bid:  # B.dateTime BETWEEN window_end - 10 s AND window_end: both ends included
        for start in {tumbling(b["dateTime"], size), tumbling(b["dateTime"], size) - size}:
            if start in highest and b["price"] == highest[start] and start <= b["dateTime"] <= start + size:
                rows.append((b["auction"], b["price"], b["bidder"], b["dateTime"], b["extra"]))
    return rows


def q8(events: Events) -> list[Row]:
    size = 10 * SECOND
    sellers = {(a["seller"], tumbling(a["dateTime"], size)) for a in events.auction}
    people = {(p["id"], p["name"], tumbling(p["dateTime"], size)) for p in events.person}
    return [(pid, name, start) for pid, name, start in people if (pid, start) in sellers]


def q9(events: Events) -> list[Row]:
    return [tuple(a[f] for f in AUCTION_FIELDS) + (b["auction"], b["bidder"], b["price"], b["dateTime"], b["extra"])
            for a, b in winning_bids(events)]


def q10(events: Events) -> list[Row]:
    return [(b["auction"], b["bidder"], b["price"], b["dateTime"], b["extra"], day(b["dateTime"]),
             utc(b["dateTime"]).strftime("%H:%M")) for b in events.bid]


def q11(events: Events) -> list[Row]:
    gap = 10 * SECOND
    times: dict[int, list[int]] = defaultdict(list)
    for b in events.bid:
        times[b["bidder"]].append(b["dateTime"])
    rows = []
    for bidder, moments in times.items():
        moments.sort()
        first = count = 0
        for i, t in enumerate(moments):
            if count and t >= moments[i - 1] + gap:  # the session ended at the previous bid + gap
                rows.append((bidder, count, first, moments[i - 1] + gap))
                count = 0
            if not count:
                first = t
            count += 1
        rows.append((bidder, count, first, moments[-1] + gap))
    return rows


def q12(events: Events) -> list[Row]:
    """Processing-time windows differ from run to run: the answer is each bidder's total over all windows."""
    return list(Counter(b["bidder"] for b in events.bid).items())


def q13(events: Events) -> list[Row]:
    return [(b["auction"], b["bidder"], b["price"], b["dateTime"], str(b["auction"] % 10_000)) for b in events.bid
            if b["auction"] % 10_000 < SIDE_INPUT_ROWS]


def bid_time_type(ms: int) -> str:
    hour = utc(ms).hour
    return "dayTime" if 8 <= hour <= 18 else "nightTime" if hour <= 6 or hour >= 20 else "otherTime"


def q14(events: Events) -> list[Row]:
    return [(b["auction"], b["bidder"], EUROS * b["price"], bid_time_type(b["dateTime"]), b["dateTime"], b["extra"],
             b["extra"].count("c")) for b in events.bid if 1_000_000 < EUROS * b["price"] < 50_000_000]


LOW, HIGH = 10_000, 1_000_000  # q15-q17's price ranks: 1 below LOW, 2 from LOW to below HIGH, 3 from HIGH
RANK_CONDITIONS = {"rank1": f"price < {LOW}", "rank2": f"price >= {LOW} AND price < {HIGH}",
                   "rank3": f"price >= {HIGH}"}  # as SQL, for the pipelines


def rank(price: int) -> int:
    return 1 if price < LOW else 2 if price < HIGH else 3


def bidding_statistics(bids: list[dict[str, Any]]) -> Row:
    """q15 and q16's figures over ``bids``: bids, then distinct bidders, then distinct auctions, each as the
    total and per price rank."""
    ranked = [[b for b in bids if rank(b["price"]) == r] for r in (1, 2, 3)]
    groups = [bids, *ranked]
    return (tuple(len(g) for g in groups) + tuple(len({b["bidder"] for b in g}) for g in groups)
            + tuple(len({b["auction"] for b in g}) for g in groups))


def q15(events: Events) -> list[Row]:
    days: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for b in events.bid:
        days[day(b["dateTime"])].append(b)
    return [(d, *bidding_statistics(bids)) for d, bids in days.items()]


def q16(events: Events) -> list[Row]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for b in events.bid:
        groups[b["channel"], day(b["dateTime"])].append(b)
    return [(channel, d, max(utc(b["dateTime"]).strftime("%H:%M") for b in bids), *bidding_statistics(bids))
            for (channel, d), bids in groups.items()]


def q17(events: Events) -> list[Row]:
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for b in events.bid:
        groups[b["auction"], day(b["dateTime"])].append(b["price"])
    return [(auction, d, len(prices), *(sum(rank(p) == r for p in prices) for r in (1, 2, 3)), min(prices),
             max(prices), sum(prices) / len(prices), sum(prices)) for (auction, d), prices in groups.items()]


def q18(events: Events) -> list[Row]:
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for b in events.bid:
        key = (b["bidder"], b["auction"])
        if key not in last or b["dateTime"] > last[key]["dateTime"]:
            last[key] = b
    return [tuple(b[f] for f in BID_FIELDS) for b in last.values()]


def q19(events: Events) -> list[Row]:
    bids: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for b in events.bid:
        bids[b["auction"]].append(b)
    return [tuple(b[f] for f in BID_FIELDS) + (number,) for group in bids.values()
            for number, b in enumerate(sorted(group, key=lambda b: (-b["price"], b["dateTime"]))[:10], start=1)]


def q20(events: Events) -> list[Row]:
    auctions = {a["id"]: a for a in events.auction if a["category"] == 10}
    return [tuple(b[f] for f in BID_FIELDS) + tuple(auctions[b["auction"]][f] for f in AUCTION_FIELDS[1:])
            for b in events.bid if b["auction"] in auctions]


def channel_id(url: str) -> str | None:
    """The value of the URL's ``channel_id`` parameter (``(&|^)channel_id=([^&]*)``), None without one."""
    for part in url.split("&"):
        if part.startswith("channel_id="):
            return part[len("channel_id="):]
    return None


def q21(events: Events) -> list[Row]:
    rows = []
    for b in events.bid:
        hot = HOT_CHANNEL_IDS.get(b["channel"].lower())
        found = hot if hot is not None else channel_id(b["url"])
        if found is not None:
            rows.append((b["auction"], b["bidder"], b["price"], b["channel"], found))
    return rows


def q22(events: Events) -> list[Row]:
    return [(b["auction"], b["bidder"], b["price"], b["channel"], *b["url"].split("/")[3:6]) for b in events.bid]
