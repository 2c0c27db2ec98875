"""gRPC stubs generated from protos/ by `make protos`; nothing here is written by hand."""
