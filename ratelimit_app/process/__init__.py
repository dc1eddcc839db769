"""What a worker process runs besides requests: daemon threads that work off the request path
(``background``), the bounded log of unexpected errors (``unexpected``), and the stop request of a
long-running command (``stop_signal``).

Layer: beside ``stores``, at the bottom with ``conf``; imports nothing of the app.
"""
