"""Checkpoint conversion between HF (Gemma2, Whisper) and the project's megatron-core
layout, its numerical verification, and a weight-statistics comparison (job side)."""

from orchestrator.runtime.megatron_import import import_megatron

import_megatron()  # first, before any module here imports megatron (see there why)

