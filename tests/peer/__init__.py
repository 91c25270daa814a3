"""Peer suites: PyTorch's own test files, run against commscope with one import swapped.

``suites.py`` names the files and the swap, ``runner.py`` runs one in a child pytest
(``plugin.py`` is loaded there), ``test_peer.py`` is the CI selection inside the suite
and ``python -m tests.peer`` (``make test-peer``) the same on demand, whole files too.
"""
