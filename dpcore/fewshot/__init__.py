"""DP few-shot generation (Tang et al., Algorithm 1): sampling, private aggregation, the plan and its accounting."""
