"""Job side: code that runs on every rank (may import torch)."""
