"""Operator dashboard: server-rendered pages, server-side SVG charts, one small script per page."""
