"""The chaos probe as a library (``python -m bench.chaos_probe`` is its command line): the private cluster
(:mod:`.cluster`), the records (:mod:`.records`), the load (:mod:`.load`), the fault schedule (:mod:`.faults`)
and the report (:mod:`.report`)."""
