"""Running pipelines: the Spark session, checkpoints, stop and restart, progress."""
