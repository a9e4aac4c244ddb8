"""Input files written as a program that writes them one after the other does.

Spark's file source (the Files source's default reader) takes the oldest file first, by
modification time; files a test writes within the same millisecond would come in any order.
Each file here is dated ``number`` seconds after the first, so they are taken in that order."""

from __future__ import annotations

import os
from pathlib import Path

FIRST_MODIFIED = 1_700_000_000  # seconds since the epoch (2023): in the past, like any finished file


def write_in_order(path: Path, text: str, number: int) -> None:
    path.write_text(text)
    os.utime(path, (FIRST_MODIFIED + number, FIRST_MODIFIED + number))
