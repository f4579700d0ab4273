"""Engine-specific inputs beside the ``/metrics`` page (:mod:`detector.engine_metrics` reads the pages
of every engine in one pass): :mod:`detector.engines.llamacpp`, llama.cpp's ``/slots``."""
