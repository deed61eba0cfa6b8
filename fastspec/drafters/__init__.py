"""Drafters: cheap proposers of tokens that the target model verifies."""
