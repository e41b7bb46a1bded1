"""The paper's experiments, live and simulated, and their reports."""
