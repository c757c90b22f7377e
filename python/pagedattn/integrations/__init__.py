"""Integrations of pagedattn with serving stacks.

- ``pagedattn.integrations.transformers``: an attention backend for Hugging Face Transformers'
  continuous batching (``generate_batch``, ``transformers serve --continuous_batching``).

Each integration imports its framework only when it is imported itself, so ``import pagedattn``
never needs them. docs/integrations.md in the source tree has the setup and the mappings.
"""
