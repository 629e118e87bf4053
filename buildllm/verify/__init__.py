"""`buildllm verify memory | estimate | mfu`: the product's own claims checked on this machine, by
running the product's own code; exit 1 when a figure falls outside its stated range. Bounded by
default (a minute or two on two idle cores); --full runs the complete set.
"""
