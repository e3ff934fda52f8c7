"""Privacy accounting: events, their composition, privacy plans and spends, and the budget ledger."""
