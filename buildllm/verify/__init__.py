"""`buildllm verify memory | estimate | mfu`: the product's own claims checked on this machine.

Each check predicts, measures by running the product's own code, prints prediction against
measurement with the stated range, writes its record (metrics/verify_<check>.json, or --out) and
exits 1 when a figure falls outside its range (0 when all are inside). Bounded by default (a few
shapes, a short run: a minute or two on two idle cores); --full runs the complete set.
"""
