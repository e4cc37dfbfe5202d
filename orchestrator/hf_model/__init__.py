"""The AudioLLM as Hugging Face code: the configuration, modeling and processing files
that `audiollm convert megatron-to-hf` copies into an exported model directory, where
`AutoModelForCausalLM` / `AutoProcessor.from_pretrained(DIR, trust_remote_code=True)`
load them. They import torch, numpy and transformers only (never this project), so an
export loads where the project is not installed; tests/convert/test_hf_model.py holds
them to that."""

# The files an export carries, in the order HF's remote-code loader needs them.
REMOTE_CODE_FILES = ("configuration_audiollm.py", "modeling_audiollm.py", "processing_audiollm.py",
                     "resample_audiollm.py", "longform_audiollm.py", "pipeline_audiollm.py")
