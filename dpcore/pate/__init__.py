"""PromptPATE (Duan et al. Section 4.2): teachers, Confident-GNMax, the student and its privacy analysis."""
