"""Checkpoint interop with peer libraries, safetensors only, never pickle.

- HF ``transformers``: Llama 3 (``hf_llama``), Qwen2-VL (``hf_qwen2_vl``);
- ``diffusers``: Wan2.1 DiT (``diffusers_wan``) and Wan2.1 VAE (``diffusers_wan_vae``).

Each module has ``import_*(src) -> (config, state_dict)``, ``load_*(src, device)``
and ``export_*(model, dst) -> Path`` plus its config and key converters; the
state-dict converters keep their module's names (``hf_llama.hf_to_lf_state``...).
"""

from lf_ir.interop.diffusers_wan import (
    diffusers_config_from_wan,
    export_diffusers_wan,
    import_diffusers_wan,
    load_diffusers_wan,
    wan_config_from_diffusers,
)
from lf_ir.interop.diffusers_wan_vae import (
    diffusers_config_from_wan_vae,
    export_diffusers_wan_vae,
    import_diffusers_wan_vae,
    load_diffusers_wan_vae,
    wan_vae_config_from_diffusers,
)
from lf_ir.interop.hf_llama import (
    export_hf_llama,
    hf_config_from_llama3,
    hf_to_lf_state,
    import_hf_llama,
    lf_to_hf_state,
    llama3_config_from_hf,
    load_hf_llama,
)
from lf_ir.interop.hf_qwen2_vl import (
    export_hf_qwen2_vl,
    hf_config_from_qwen2_vl,
    import_hf_qwen2_vl,
    load_hf_qwen2_vl,
    qwen2_vl_config_from_hf,
)

__all__ = [
    "diffusers_config_from_wan", "diffusers_config_from_wan_vae", "export_diffusers_wan", "export_diffusers_wan_vae",
    "export_hf_llama", "export_hf_qwen2_vl", "hf_config_from_llama3", "hf_config_from_qwen2_vl", "hf_to_lf_state",
    "import_diffusers_wan", "import_diffusers_wan_vae", "import_hf_llama", "import_hf_qwen2_vl", "lf_to_hf_state",
    "llama3_config_from_hf", "load_diffusers_wan", "load_diffusers_wan_vae", "load_hf_llama", "load_hf_qwen2_vl",
    "qwen2_vl_config_from_hf", "wan_config_from_diffusers", "wan_vae_config_from_diffusers",
]
