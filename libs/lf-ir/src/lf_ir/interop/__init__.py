"""Checkpoint interop with peer libraries (HF ``transformers``), safetensors only, never pickle."""

from lf_ir.interop.hf_llama import (
    export_hf_llama,
    hf_config_from_llama3,
    hf_to_lf_state,
    import_hf_llama,
    lf_to_hf_state,
    llama3_config_from_hf,
    load_hf_llama,
)

__all__ = ["export_hf_llama", "hf_config_from_llama3", "hf_to_lf_state", "import_hf_llama",
           "lf_to_hf_state", "llama3_config_from_hf", "load_hf_llama"]
