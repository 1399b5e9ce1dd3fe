"""The cost model of §3.1: byte floors per kernel class, the ceiling factorization and S(N).

``profile`` reads the profile format (``docs/profile-format.md``), ``floors`` turns a kernel class
into its byte floor on a GPU of ``specpilot_mem.gpus``, ``ceiling`` factors the ceiling.
"""


def ceiling_report(profile_path, lattice_paths, **options) -> dict:
    """See ``specpilot_mem.costmodel.ceiling.ceiling_report`` (imported on use: this package stays light)."""
    from specpilot_mem.costmodel.ceiling import ceiling_report as report

    return report(profile_path, lattice_paths, **options)
