"""The Ming-Image 0.1 pack (packs-contract-more §D.1): under construction, not yet registered."""
