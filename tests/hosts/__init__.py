"""Simulated hosts for multi-host tests: each host in its own Linux namespaces.

``Cluster`` / ``Host`` (``cluster.py``) make the hosts; ``start_job`` / ``MultiHostJob``
(``job.py``) run one ``commscope run`` job across them. DEVELOPERS.md says what is
simulated and what is not.
"""
