"""What a run stands on, below the connectors and the compiler: the Spark session and the
connector jars it gets (``session.py``, ``jars.py``), the user's own modules shipped to Spark's
Python workers (``user_modules.py``), the state dir's storage and layout
(``storage.py``, ``state_paths.py``, ``checkpoints.py``, ``operator_snapshots.py``) and admission
control's batch caps (``admission.py``)."""
