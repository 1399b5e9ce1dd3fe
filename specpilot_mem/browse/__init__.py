"""The memory browser: ``specpilot-mem browse`` writes a static site of the memory (``site.build_site``)."""
