"""NEXMark events: a deterministic generator of persons, auctions and bids, and their JSON-lines folders.

Written from the published NEXMark data model (the Beam and Flink NEXMark generators' descriptions):

* Event ``n`` (0, 1, 2, ...) is a person when ``n % 50 == 0``, an auction when ``n % 50`` is 1 to 3,
  a bid otherwise: 1 person, 3 auctions and 46 bids in every 50 events.
* Its ``dateTime`` is ``start_ms + n * interval_ms``: unique, increasing at a fixed rate.
* Persons and auctions are numbered in creation order from 1000. An auction's seller is, 3 times in
  4, the hot seller (the first of the latest block of 100 persons), else one of the last 1000
  persons or up to 10 not created yet. A bid's auction is, 1 time in 2, the hot auction (the first
  of the latest block of 100 auctions), else one of the last 100 auctions or up to 10 not created
  yet; its bidder is, 3 times in 4, the hot bidder (the second of the latest block of 100 persons),
  else a random recent person as for sellers.
* Prices are ``round(10 ** (6 u) * 100)`` cents (``u`` uniform in [0, 1)). Categories are 10 to 14.
  An auction lasts 1 ms to twice the time it takes to create 100 auctions.
* A bid's channel is, 1 time in 2, one of the four hot channels (Google, Facebook, Baidu, Apple, each
  with its own URL), else ``channel-<k>`` for ``k`` below 10,000, whose URL carries
  ``&channel_id=<k bit-reversed>`` 9 times in 10. URLs are ``https://www.nexmark.com/<d1>/<d2>/<d3>/item.htm?query=1``.
* ``extra`` pads a person to about 200 characters, an auction to 500 and a bid to 100.

Everything comes from one ``random.Random(seed)`` drawn in event order, and only through its
``random()`` (whose sequence Python keeps across versions): the same arguments give the same
events. The files are written in an order shuffled within a bound: each event moves later by a
seeded delay below ``max_delay_ms``, so a reader sees event times out of order by less than that.
"""

from __future__ import annotations

import datetime
import json
import os
import random
from dataclasses import dataclass
from typing import Any

PERSON_PROPORTION, AUCTION_PROPORTION, DENOMINATOR = 1, 3, 50
FIRST_PERSON_ID = FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID, CATEGORIES = 10, 5
HOT_RATIO = 100  # hot sellers, bidders and auctions: the first (second) of the latest block of this many
HOT_SELLERS, HOT_BIDDERS, HOT_AUCTIONS = 4, 4, 2  # 1 - 1/n of the choices go to the hot one
ACTIVE_PERSONS, IN_FLIGHT_AUCTIONS, ID_LEAD = 1000, 100, 10
CHANNELS, HOT_CHANNELS = 10_000, ("Google", "Facebook", "Baidu", "Apple")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
AVERAGE_SIZE = {"person": 200, "auction": 500, "bid": 100}

KINDS = ("person", "auction", "bid")
SCHEMAS = {  # the fields of each kind, as headrace's schema strings (Spark DDL types)
    "person": {"id": "long", "name": "string", "emailAddress": "string", "creditCard": "string", "city": "string",
               "state": "string", "dateTime": "timestamp", "extra": "string"},
    "auction": {"id": "long", "itemName": "string", "description": "string", "initialBid": "long",
                "reserve": "long", "dateTime": "timestamp", "expires": "timestamp", "seller": "long",
                "category": "long", "extra": "string"},
    "bid": {"auction": "long", "bidder": "long", "price": "long", "channel": "string", "url": "string",
            "dateTime": "timestamp", "extra": "string"},
}
BID_FIELDS, AUCTION_FIELDS = tuple(SCHEMAS["bid"]), tuple(SCHEMAS["auction"])
TIME_FIELDS = ("dateTime", "expires")
SIDE_INPUT_ROWS = 10_000  # q13's side input: key k -> value "k", as NEXMark's side-input generator writes it


@dataclass(frozen=True)
class EventsConfig:
    events: int = 300_000
    seed: int = 0
    files: int = 6  # files per kind, written in event-time order: one micro-batch each
    start_ms: int = 1_704_153_590_000  # 2024-01-01 23:59:50 UTC: a run crosses midnight (q15-q17 group by day)
    interval_ms: int = 1  # event time between two consecutive events
    max_delay_ms: int = 2_000  # the bound of the out-of-orderness


@dataclass
class Events:
    """The generated events of each kind (dicts with times as epoch milliseconds), in event order."""

    config: EventsConfig
    person: list[dict[str, Any]]
    auction: list[dict[str, Any]]
    bid: list[dict[str, Any]]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return {"person": self.person, "auction": self.auction, "bid": self.bid}[kind]


def last_person(n: int) -> int:
    """The newest person (base 0) at event ``n``: the one event ``n`` creates, if it is a person."""
    return n // DENOMINATOR


def last_auction(n: int) -> int:
    """The newest auction (base 0) at event ``n``: the one event ``n`` creates, if it is an auction."""
    epoch, offset = divmod(n, DENOMINATOR)
    if offset < PERSON_PROPORTION:
        return (epoch - 1) * AUCTION_PROPORTION + AUCTION_PROPORTION - 1
    return epoch * AUCTION_PROPORTION + min(offset - PERSON_PROPORTION, AUCTION_PROPORTION - 1)


def reverse_bits(value: int) -> int:
    """``value``'s 32 bits in reverse order, read as a signed 32-bit integer (Java's ``Integer.reverse``)."""
    reversed_value = int(f"{value & 0xFFFFFFFF:032b}"[::-1], 2)
    return reversed_value - (1 << 32) if reversed_value >= 1 << 31 else reversed_value


class Draws:
    """The generator's random choices, all from one ``random.Random(seed)`` through ``random()``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.pad = "".join(chr(97 + self.below(26)) for _ in range(1 << 16))  # extra fields are slices of it

    def below(self, n: int) -> int:
        return int(self.rng.random() * n)

    def price(self) -> int:
        return round(10 ** (self.rng.random() * 6) * 100)

    def text(self, max_length: int, special: str = " ") -> str:
        """3 to ``max_length - 1`` letters, about 1 in 13 of them ``special``, trimmed."""
        return "".join(special if self.below(13) == 0 else chr(97 + self.below(26))
                       for _ in range(3 + self.below(max_length - 3))).strip()

    def extra(self, kind: str, size: int) -> str:
        """Padding that brings a record of ``size`` characters to its kind's average size, ±20 %."""
        wanted = AVERAGE_SIZE[kind] - size
        if wanted <= 0:
            return ""
        spread = round(wanted * 0.2)
        length = wanted - spread + (self.below(2 * spread) if spread else 0)
        start = self.below(len(self.pad) - length)
        return self.pad[start:start + length]

    def url(self) -> str:
        return f"https://www.nexmark.com/{self.text(5, '_')}/{self.text(5, '_')}/{self.text(5, '_')}/item.htm?query=1"

    def recent_person(self, n: int) -> int:
        persons = last_person(n) + 1
        active = min(persons, ACTIVE_PERSONS)
        return persons - active + self.below(active + ID_LEAD)

    def recent_auction(self, n: int) -> int:
        newest = last_auction(n)
        oldest = max(newest - IN_FLIGHT_AUCTIONS, 0)
        return oldest + self.below(newest - oldest + 1 + ID_LEAD)


def generate(config: EventsConfig) -> Events:
    """Every event of ``config``, in event order."""
    draws = Draws(config.seed)
    hot_urls = [draws.url() for _ in HOT_CHANNELS]
    channel_urls = []
    for k in range(CHANNELS):
        url = draws.url()
        channel_urls.append(url + f"&channel_id={abs(reverse_bits(k))}" if draws.below(10) > 0 else url)
    events = Events(config, [], [], [])
    for n in range(config.events):
        time_ms = config.start_ms + n * config.interval_ms
        offset = n % DENOMINATOR
        if offset < PERSON_PROPORTION:
            name = f"{FIRST_NAMES[draws.below(len(FIRST_NAMES))]} {LAST_NAMES[draws.below(len(LAST_NAMES))]}"
            email = f"{draws.text(7)}@{draws.text(5)}.com"
            card = " ".join(f"{draws.below(10_000):04d}" for _ in range(4))
            city, state = US_CITIES[draws.below(len(US_CITIES))], US_STATES[draws.below(len(US_STATES))]
            size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
            events.person.append({"id": FIRST_PERSON_ID + last_person(n), "name": name, "emailAddress": email,
                                  "creditCard": card, "city": city, "state": state, "dateTime": time_ms,
                                  "extra": draws.extra("person", size)})
        elif offset < PERSON_PROPORTION + AUCTION_PROPORTION:
            hot = draws.below(HOT_SELLERS) > 0
            seller = last_person(n) // HOT_RATIO * HOT_RATIO if hot else draws.recent_person(n)
            category = FIRST_CATEGORY_ID + draws.below(CATEGORIES)
            initial = draws.price()
            expires = time_ms + 1 + draws.below(longest_auction_ms(config))
            item, description = draws.text(20), draws.text(100)
            reserve = initial + draws.price()
            size = 8 + len(item) + len(description) + 5 * 8
            events.auction.append({"id": FIRST_AUCTION_ID + last_auction(n), "itemName": item,
                                   "description": description, "initialBid": initial, "reserve": reserve,
                                   "dateTime": time_ms, "expires": expires, "seller": FIRST_PERSON_ID + seller,
                                   "category": category, "extra": draws.extra("auction", size)})
        else:
            hot = draws.below(HOT_AUCTIONS) > 0
            auction = last_auction(n) // HOT_RATIO * HOT_RATIO if hot else draws.recent_auction(n)
            hot = draws.below(HOT_BIDDERS) > 0
            bidder = last_person(n) // HOT_RATIO * HOT_RATIO + 1 if hot else draws.recent_person(n)
            price = draws.price()
            if draws.below(2) > 0:
                i = draws.below(len(HOT_CHANNELS))
                channel, url = HOT_CHANNELS[i], hot_urls[i]
            else:
                k = draws.below(CHANNELS)
                channel, url = f"channel-{k}", channel_urls[k]
            events.bid.append({"auction": FIRST_AUCTION_ID + auction, "bidder": FIRST_PERSON_ID + bidder,
                               "price": price, "channel": channel, "url": url, "dateTime": time_ms,
                               "extra": draws.extra("bid", 4 * 8)})
    return events


def iso(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 text in UTC, as the JSON files hold times."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def longest_auction_ms(config: EventsConfig) -> int:
    """An auction lasts at most this long: twice the time it takes to create IN_FLIGHT_AUCTIONS auctions."""
    return 2 * IN_FLIGHT_AUCTIONS * DENOMINATOR // AUCTION_PROPORTION * config.interval_ms


def flush_ms(config: EventsConfig) -> int:
    """The flush rows' time: a day after every event and every auction's end."""
    return config.start_ms + config.events * config.interval_ms + longest_auction_ms(config) + 86_400_000


def flush_row(kind: str, at_ms: int) -> dict[str, Any]:
    """A row of ``kind`` at ``at_ms`` that matches nothing (ids -1): it only moves a watermark."""
    return {name: -1 if type_ == "long" else "" if type_ == "string" else at_ms
            for name, type_ in SCHEMAS[kind].items()}


def write(events: Events, root: str) -> None:
    """Write ``root/events/<kind>/part-NNNNN.jsonl`` (``config.files`` files per kind, each a slice of the
    shuffled order, modification times increasing with the part number), ``root/flush/<kind>/end.jsonl``
    (one flush row per kind, newer than every part) and ``root/side_input.csv`` (q13's side input)."""
    config = events.config
    jitter = random.Random(f"{config.seed}-order")  # apart from the events' draws: the order changes no event
    delays = [int(jitter.random() * config.max_delay_ms) for _ in range(config.events)]
    order = sorted(range(config.events), key=lambda n: (n * config.interval_ms + delays[n], n))
    position = [0] * config.events
    for p, n in enumerate(order):
        position[n] = p
    old = 1_600_000_000  # modification times in the past, one second apart
    for kind in KINDS:
        parts: list[list[tuple[int, str]]] = [[] for _ in range(config.files)]
        for record in events.of(kind):
            p = position[(record["dateTime"] - config.start_ms) // config.interval_ms]
            parts[p * config.files // config.events].append((p, json.dumps(_as_json(record))))
        for number, lines in enumerate(parts):
            _write_lines(folder(root, kind), f"part-{number:05d}.jsonl", [line for _, line in sorted(lines)],
                         old + number)
        flush = json.dumps(_as_json(flush_row(kind, flush_ms(config))))
        _write_lines(folder(root, kind, flush=True), "end.jsonl", [flush], old + config.files)
    with open(side_input_path(root), "w") as handle:
        handle.write("key,value\n" + "".join(f"{k},{k}\n" for k in range(SIDE_INPUT_ROWS)))


def folder(root: str, kind: str, *, flush: bool = False) -> str:
    """The folder of ``kind``'s files, or of its flush row."""
    return os.path.join(root, "flush" if flush else "events", kind)


def with_flush(root: str, kind: str) -> str:
    """The folders of ``kind``'s files and of its flush row, as one Hadoop glob (Spark's file source reads it)."""
    return os.path.join(root, "{events,flush}", kind)


def side_input_path(root: str) -> str:
    return os.path.join(root, "side_input.csv")


def _as_json(record: dict[str, Any]) -> dict[str, Any]:
    return {k: iso(v) if k in TIME_FIELDS else v for k, v in record.items()}


def _write_lines(directory: str, name: str, lines: list[str], mtime: int) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as handle:
        handle.write("".join(line + "\n" for line in lines))
    os.utime(path, (mtime, mtime))  # Spark's file source takes files oldest first

