"""Offline tools run by make targets (fetching and converting models); no service imports them."""
