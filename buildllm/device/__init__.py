"""The device: which one a run uses and why, its precision, and what it can tell about itself
(synchronisation, memory, peak FLOP/s, hardware). The only package that asks what kind a device is."""
