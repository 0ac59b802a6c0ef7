"""The formats of ``LANGUAGE_CODE`` (``en-us``)."""
