"""Clickstream sessionisation: a user's clicks less than 30 s apart form one session;
each session is reported once it has closed, with its clicks and distinct pages.

    headrace run examples/sessions.py
"""

import headrace as hr

pipeline = hr.Pipeline("sessions")
clicks = pipeline.source("clicks", hr.sources.Generator("clicks", limit=400_000, rows_per_batch=100_000),
                         event_time="event_time", max_out_of_orderness="5s")
sessions = (clicks.key_by("user_id")
                  .window(hr.Session("30s"), name="sessions")
                  .aggregate(clicks=hr.count(), first_page=hr.min("url"), last_page=hr.max("url")))
sessions.sink("console", hr.sinks.Console(limit=10))
