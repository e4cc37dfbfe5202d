"""Job-side model code: the Gemma2 decoder on megatron-core, the Whisper encoder and
adapter, audio fusion, and the AudioLLM that puts them together (imports torch)."""
