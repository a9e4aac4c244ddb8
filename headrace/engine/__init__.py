"""The operator engine: the pure-Python logic of headrace's stateful steps, free of Spark.

* ``window_functions`` - how a window turns its records into a result (built-in aggregates,
  reduce, a user's ``hr.AggregateFunction``, a process-window function).
* ``window_panes`` - the event-time window operator: the windows of a key, triggers, allowed
  lateness, accumulation, session merging, count windows and the late side output.
* ``process_logic`` - runs a ``hr.KeyedProcessFunction`` over a key's state and timers.
* ``state_cells`` - the per-key state cells behind ``hr.ValueState``, ``hr.ListState`` and
  ``hr.MapState``: handles, time-to-live and sweeping.
* ``instances`` - runs one Apex-style operator or Storm bolt instance over one streaming window.
* ``tuple_windows`` - which tuples each activation of a Storm windowed bolt holds.
* ``rolling`` - the fold of a rolling ``reduce``: the user's function over a key's records.

The Spark side (``headrace/spark/``) stores this state under each key and calls the operators
once per micro-batch; the operators may import the public modules (``headrace.windows``,
``headrace.triggers``, ``headrace.state``, ``headrace.process``), never the other way round.
"""
