"""Drafters: cheap proposers of tokens that the target model verifies.

Lives here: ``base`` (the Target and Drafter protocols, Proposal, TreeProposal, and
SamplingParams: the vocabulary the loop and the drafters share), ``draft_model``
(DraftModelDrafter), ``ngram`` (NgramDrafter, prompt lookup), ``dflash_config``,
``dflash_model`` (the DFlash block-diffusion model) and ``dflash`` (DFlashDrafter),
``tree_sampling`` (trees drawn without replacement among siblings).

May import: :mod:`fastspec.kernels`, :mod:`fastspec.model`, :mod:`fastspec.formats`,
:mod:`fastspec.text`. Nothing above it (the decoding loop imports the drafters, not the
other way round).
"""
from fastspec.lazy import exports

__all__ = ["Drafter", "Proposal", "Target", "TreeProposal", "SamplingParams", "DraftModelDrafter",
           "NgramDrafter", "DFlashDrafter", "DFlashModel", "DFlashConfig"]

__getattr__, __dir__ = exports(__name__, {
    "Drafter": "base",
    "Proposal": "base",
    "Target": "base",
    "TreeProposal": "base",
    "SamplingParams": "base",
    "DraftModelDrafter": "draft_model",
    "NgramDrafter": "ngram",
    "DFlashDrafter": "dflash",
    "DFlashModel": "dflash_model",
    "DFlashConfig": "dflash_config",
})
