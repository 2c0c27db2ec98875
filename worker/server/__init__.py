"""The worker's process shell: gRPC servicer and error mapping, proto conversion, settings, metrics."""
