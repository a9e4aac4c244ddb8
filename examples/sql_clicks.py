"""Clicks per shop section and second, in Spark SQL: the clickstream joined with a static
table of sections, counted in 1-second event-time windows. Each window is printed once, when
the watermark passes its end (the last ones when the bounded input ends).

    headrace run examples/sql_clicks.py
"""

import headrace as hr

SECTIONS = ("books", "garden", "music", "toys")

pipeline = hr.Pipeline("sql_clicks")
pipeline.source("clicks", hr.sources.Generator("clicks", limit=300_000),  # 3 s of event time
                event_time="event_time", max_out_of_orderness="1s")
pipeline.table("sections", [{"url": f"https://shop.example/item/{k:03d}", "section": SECTIONS[k % 4]}
                            for k in range(100)])
per_second = pipeline.sql("""
    SELECT window, s.section, count(*) AS clicks, approx_count_distinct(c.user_id) AS users
      FROM clicks c
      JOIN sections s ON c.url = s.url
     GROUP BY window(c.event_time, '1 second'), s.section
""", name="per_second")
per_second.sink("console", hr.sinks.Console(limit=None))

if __name__ == "__main__":
    print(pipeline.explain())
    pipeline.run(fresh=True, progress="quiet")
