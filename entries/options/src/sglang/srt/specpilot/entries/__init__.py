"""One module per SpecPilot entry (``<entry_id>.py`` with ``ENTRY = EntrySpec(...)``), found by discovery."""
