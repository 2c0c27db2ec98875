"""Which worker serves a request: routing keys, the router, worker addresses and their load reports."""
