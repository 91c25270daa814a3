"""Scripts the tests launch as real jobs (``commscope run``), and helpers to run them."""
