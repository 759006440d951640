"""Renderers: turn whichgpu's value types into JSON documents and terminal tables.

No computation happens here: every number shown was computed by a library layer, and these
modules only choose what to show and how.
"""
