"""Stream processors: exactly-once effects in PostgreSQL per ingested event.

:mod:`.contract` is what a processor is; :mod:`.runner` runs them (effects and cursor in
one transaction); :mod:`.control` keeps the ``processors`` table (pause, failure, lag);
:mod:`.registry` finds them by name; :mod:`.runs_fold` and :mod:`.runs` are the built-in
``runs`` projection. docs/processors.md is the guide.
"""
