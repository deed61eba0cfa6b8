"""The measuring tools behind the console script: ``bench`` (benchmark), ``demo``/``eval``
(demo), plots, and the record of where a run ran (environment)."""
