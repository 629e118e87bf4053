"""The model: the GPT itself, the named profiles (shapes and runtime defaults), and its FLOPs."""
