"""The PyTorch reference: LLaDA-V's sampler, Seer on top of it, the fixture task's encoder, seer-reference."""
