"""Reward sources: simulator success predicates, success classifiers, VLM judges, shaping."""
