"""One-round probes, kept with their results (``bench/archive/results``) for the record: each answered one
question of one round and is not maintained beyond ``python -m bench.archive.<name> --help``."""
