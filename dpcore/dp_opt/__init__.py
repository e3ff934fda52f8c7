"""DP-OPT: a private instruction written by a noisy ensemble of in-context prompts (Hong et al., ICLR 2024).

Modules, imported one way (`instruction` -> `ensemble`, `selection`, `sampling`, `privacy`, `presets`):

- `presets.py`: the method's public hyperparameters (`DpOptParams`), the paper's and a CPU smoke size.
- `sampling.py`: per-token Poisson subsampling and the disjoint keyed-hash partition into subsets; the
  holdout split that candidate selection reads.
- `selection.py`: the private token choice over a vote histogram (Gumbel noise: the exponential mechanism),
  the stopping rule, and the private choice among candidate instructions.
- `privacy.py`: the events of one token, of T tokens of J candidates and of the selection; `dp_opt_plan`.
- `ensemble.py`: the meta prompts of the subsets and their next-token votes (the language model).
- `instruction.py`: `write_instruction` (the whole private generation) and the instruction as a zero-shot prompt.
"""
