"""AdaDPSyn (Gao et al. 2024, arXiv 2410.12085): Tang et al.'s Algorithm 1 with a data-adaptive aggregation,
Precision-Focused Iterative Radius Reduction (PFIRR), at every token step: its parameters, the radius search,
the aggregate, its privacy events and plan, and the token choice from a step's logits."""
