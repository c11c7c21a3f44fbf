"""scalelab analysis: scaling and cost figures computed from run records, and their reports."""
