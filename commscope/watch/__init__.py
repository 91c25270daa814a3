"""`commscope watch`: a running job's collectives, live (see docs/watch.md)."""
