"""``headrace server``: pipelines submitted to one long-running server, each in a driver process of
its own that the server supervises (docs/control-plane.md).

* ``registry``: what the server knows of each pipeline, in SQLite under its state dir;
* ``supervisor``: starts, watches, restarts and stops the driver processes;
* ``driver``: the process the supervisor starts, which runs ``headrace run`` and leaves its exit status;
* ``http_api``: the REST API (and its OpenAPI description), with the token and Host checks;
* ``client``: what the CLI's ``submit``, ``list``, ``status``, ``stop``, ``restart`` and ``logs`` call.
"""
