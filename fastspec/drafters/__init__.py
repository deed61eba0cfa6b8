"""Drafters: cheap proposers of tokens that the target model verifies."""
from fastspec.drafters.base import Drafter, Proposal, SamplingParams
from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.drafters.ngram import NgramDrafter
from fastspec.drafters.dflash import DFlashDrafter

__all__ = ["Drafter", "Proposal", "SamplingParams", "DraftModelDrafter", "NgramDrafter", "DFlashDrafter"]
