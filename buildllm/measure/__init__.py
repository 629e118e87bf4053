"""Measurement before a long run: dry run, benchmark, estimate, memory estimate, batch finder, sweep."""
