"""Torch-free tokenizer leaf shared by gateway/ and backend/ (imports nothing of ours)."""
