"""Pure arithmetic, numpy only: Feistel permutation, lanes, exact mixing, curriculum schedule."""
