"""``letsinfer doctor``: is this machine fit to run letsinfer, and (on the main,
``--cluster``) does the cluster hold every invariant of the design.

Each check gives findings with a level (ok, warn, fail) and a one-line fix.
The checks of one machine import only the standard library at module level,
so that ``python -m letsinfer.doctor`` runs from the letsinfer wheel alone on
a host where letsinfer is not installed yet (site.yml does that before it
changes anything); checks that need an installed letsinfer import it lazily.
"""
