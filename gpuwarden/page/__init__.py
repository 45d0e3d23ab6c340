"""The node page served at ``/``: a static HTML page, its script and its style sheet (package data, no external
assets); the script reads ``api/v1/gpus`` and ``api/v1/diagnosis`` and redraws itself every few seconds."""
