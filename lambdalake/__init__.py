"""The entry points on top of the layers: the ``lambdalake`` command line, the demo (``make
run``) and the live platform (``make up`` / ``make down``). Nothing below imports this package."""
