"""Published config.json files, written by hand.

NEMOTRON_H_8B: nvidia/Nemotron-H-8B-Base-8K's config.json as reproduced in
NVIDIA-NeMo/Megatron-Bridge tests/unit_tests/models/nemotronh/test_nemotron_h_bridge.py.
MAMBA2_2_7B: state-spaces/mamba2-2.7b in transformers' Mamba2Config keys, as the converted
state-spaces checkpoints write them (mamba2-780m's converted config is quoted with these
keys in public code: num_heads = 2·hidden/64, vocab_size padded to 16, tied); its values
are mamba2-2.7b's own config (d_model 2560, n_layer 64, vocab 50277 padded to a multiple
of 16, ssm_cfg layer Mamba2 with its defaults d_state 128, headdim 64, expand 2,
ngroups 1, d_conv 4, chunk_size 256).
"""

NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_head_dim": 128,
    "auto_map": {
        "AutoConfig": "configuration_nemotron_h.NemotronHConfig",
        "AutoModelForCausalLM": "modeling_nemotron_h.NemotronHForCausalLM",
    },
    "bos_token_id": 1,
    "chunk_size": 128,
    "conv_kernel": 4,
    "eos_token_id": 2,
    "expand": 2,
    "hidden_act": "relu2",
    "hidden_dropout": 0.0,
    "hidden_size": 4096,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "initializer_range": 0.02,
    "intermediate_size": 21504,
    "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64,
    "mamba_hidden_act": "silu",
    "mamba_num_heads": 128,
    "mamba_proj_bias": False,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "mlp_hidden_act": "relu2",
    "model_type": "nemotron_h",
    "n_groups": 8,
    "num_attention_heads": 32,
    "num_hidden_layers": 52,
    "num_key_value_heads": 8,
    "num_logits_to_keep": 1,
    "pad_token_id": 0,
    "rescale_prenorm_residual": True,
    "residual_in_fp32": False,
    "rms_norm_eps": 1e-05,
    "ssm_state_size": 128,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.48.0.dev0",
    "use_bias": False,
    "use_cache": True,
    "use_conv_bias": True,
    "use_mamba_kernels": True,
    "vocab_size": 131072,
}

MAMBA2_2_7B = {
    "architectures": ["Mamba2ForCausalLM"],
    "model_type": "mamba2",
    "num_hidden_layers": 64,
    "hidden_size": 2560,
    "vocab_size": 50288,
    "state_size": 128,
    "num_heads": 80,
    "head_dim": 64,
    "expand": 2,
    "conv_kernel": 4,
    "n_groups": 1,
    "chunk_size": 256,
    "time_step_limit": [0.0, "Infinity"],
    "rms_norm": True,
    "use_bias": False,
    "use_conv_bias": True,
    "hidden_act": "silu",
    "layer_norm_epsilon": 1e-5,
    "residual_in_fp32": True,
    "tie_word_embeddings": True,
}

#: Zamba2-2.7B in transformers' key names.  Verbatim, in the file's order, from "adapter_rank"
#: through "n_mamba_heads": Zyphra/Zamba2-2.7B-Instruct-v2's config.json (main, as the Hub
#: shows it; the library's copy ends there).  The keys after it are written by hand:
#: num_attention_heads, num_hidden_layers, num_key_value_heads, num_mem_blocks,
#: num_query_groups and vocab_size from the earlier config.json of Zyphra/Zamba2-2.7B-instruct
#: (commit d3e3e112a9ee70233c694856917161f126414d39, Zyphra's original key names: 32, 54, 32,
#: 2, 32, 32000); use_shared_attention_adapter false (that file's attention LoRA flag is
#: false, and the checkpoint holds MLP adapters only); use_mem_rope true (the tech report,
#: arXiv 2411.15242, adds rotary embeddings to the shared attention); use_conv_bias true
#: (Zamba2Config's default).
ZAMBA2_2_7B = {
    "adapter_rank": 128,
    "add_bias_linear": False,
    "architectures": ["Zamba2ForCausalLM"],
    "attention_dropout": 0.0,
    "attention_head_dim": 160,
    "attention_hidden_size": 5120,
    "bos_token_id": 1,
    "chunk_size": 256,
    "eos_token_id": 2,
    "ffn_hidden_size": 10240,
    "hidden_act": "gelu",
    "hidden_size": 2560,
    "hybrid_layer_ids": [6, 12, 18, 24, 30, 36, 42, 47, 51],
    "initializer_range": 0.02,
    "intermediate_size": 10240,
    "kv_channels": 80,
    "layers_block_type": (["mamba"] * 6 + ["hybrid"]) + (["mamba"] * 5 + ["hybrid"]) * 6
    + ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 3 + ["hybrid"] + ["mamba"] * 2,
    "mamba_d_conv": 4,
    "mamba_d_state": 64,
    "mamba_expand": 2,
    "mamba_headdim": 64,
    "mamba_ngroups": 1,
    "max_position_embeddings": 4096,
    "model_type": "zamba2",
    "n_mamba_heads": 80,
    # written by hand (see above)
    "num_attention_heads": 32,
    "num_hidden_layers": 54,
    "num_key_value_heads": 32,
    "num_mem_blocks": 2,
    "num_query_groups": 32,
    "use_conv_bias": True,
    "use_mem_rope": True,
    "use_shared_attention_adapter": False,
    "vocab_size": 32000,
}
