"""Renderers: tables, JSON, traces."""
