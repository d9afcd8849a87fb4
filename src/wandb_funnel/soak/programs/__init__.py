"""User-style programs for the soak harness; each is run as a script (``python path.py``)."""
