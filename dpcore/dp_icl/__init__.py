"""DP-ICL: private prediction by a noisy vote of disjoint exemplar subsets (Wu et al., "Privacy-Preserving
In-Context Learning for Large Language Models", ICLR 2024, Section 3; classification with RNM-Gaussian,
extraction with keyword space aggregation).

Every user query is answered by an ensemble: a fresh Poisson subsample of the private records is split into M
disjoint subsets (`subsets`), each subset's k-shot prompt votes a label (`ensemble`, through the PromptPATE flock
engine), and the vote histogram is released by report-noisy-max with Gaussian noise (`aggregation`); on an
extraction task each subset answers and the query's words a noisy majority of them name are released
(`keywords`: keyword space aggregation over the query's own words, Section 3.3 adapted). Each answered query (or
each draw of subsets shared by a block of queries) is one Poisson-subsampled Gaussian step, composed by
`dpcore.privacy.composition` (`privacy`); `answer` ties them together; `presets` holds the paper's defaults.
"""
