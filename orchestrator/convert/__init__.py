"""Checkpoint conversion between HF (Gemma2, Whisper) and the project's megatron-core
layout, its numerical verification, and a weight-statistics comparison (job side)."""
