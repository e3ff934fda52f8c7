"""PromptDPSGD (Duan et al. Section 4.1): trainable prompts and DP-SGD on them."""
