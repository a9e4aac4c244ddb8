"""``headrace server``: pipelines submitted to one long-running server, each in a driver process of
its own that the server supervises (docs/control-plane.md).

* ``registry``: what the server knows of each pipeline (and the errors its drivers ended with), in
  SQLite under its state dir; ``operations``: the requests under way, in the same file;
* ``supervisor``: starts, watches, restarts and stops the driver processes;
* ``preflight``: what is checked before a driver starts (the file builds in time, the checkpoint can
  be continued), so that what a driver would refuse is refused at once;
* ``driver``: the process the supervisor starts, which runs ``headrace run`` and leaves its exit status;
* ``standby_pool``: the warm standby driver of ``--standby``;
* ``http_api``: the REST API, with the token, Origin and Host checks; ``openapi``: its description;
* ``metrics``: each pipeline's figures, for ``/metrics`` and the web UI; ``views``: its queryable
  views; ``checkpoint_info``: its checkpoint's batches; ``config_info``: its configuration, secrets
  redacted; ``pipeline_dirs``: where a pipeline's files are; ``ui/``: the web UI's files;
* ``client``: the API from Python, as the CLI's pipeline commands and ``headrace query`` call it.
"""
