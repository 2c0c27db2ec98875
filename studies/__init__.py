"""One-off studies behind design choices (a GPU check, profiles, library and index comparisons); each
writes its section of docs/BENCHMARKS.md. `make bench` runs bench/, not these; nothing in the product
imports them."""
