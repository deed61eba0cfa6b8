"""Drafters: cheap proposers of tokens that the target model verifies."""
from fastspec.drafters.base import Drafter, Proposal, Target
from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.drafters.ngram import NgramDrafter
from fastspec.drafters.dflash import DFlashDrafter

__all__ = ["Drafter", "Proposal", "Target", "DraftModelDrafter", "NgramDrafter", "DFlashDrafter"]
