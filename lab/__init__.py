"""Lab tools: measurements that teach rather than decide (README.md: the question each answers)."""
