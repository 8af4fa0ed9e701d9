"""The engine: registry, threads, the one stop, snapshot, fork safety, config, checks, internals."""
