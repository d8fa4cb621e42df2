"""Drafters of the protocol in core/drafter.py: a draft model, prompt lookup, prompt lookup in front
of another drafter, and an EAGLE-style feature draft."""
from .feature import FeatureDraft, FeatureDrafter, load_feature_draft
from .lookup import LookupDrafter
from .model import ModelDrafter
from .ngram import NGramDrafter, ngram_lookup_reference

__all__ = ["FeatureDraft", "FeatureDrafter", "load_feature_draft", "LookupDrafter", "ModelDrafter", "NGramDrafter",
           "ngram_lookup_reference"]
