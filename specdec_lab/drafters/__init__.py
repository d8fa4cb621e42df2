"""Drafters of the protocol in core/drafter.py: a draft model, prompt lookup, prompt lookup in front
of another drafter, an EAGLE-style feature draft and an EAGLE-3-style one (multi-layer features)."""
from .eagle3 import Eagle3Draft, Eagle3Drafter, load_eagle3_draft, save_eagle3_draft
from .feature import FeatureDraft, FeatureDrafter, load_feature_draft
from .lookup import LookupDrafter
from .model import ModelDrafter
from .ngram import NGramDrafter, ngram_lookup_reference
from .vocab_subset import VocabSubsetHead, restrict_vocab

__all__ = ["Eagle3Draft", "Eagle3Drafter", "load_eagle3_draft", "save_eagle3_draft", "FeatureDraft", "FeatureDrafter", "load_feature_draft", "LookupDrafter", "ModelDrafter", "NGramDrafter",
           "ngram_lookup_reference", "VocabSubsetHead", "restrict_vocab"]
