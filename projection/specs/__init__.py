"""The input language: pydantic v2 models, frozen, extra keys forbidden."""
