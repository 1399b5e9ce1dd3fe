"""The controller's statistics (§3.2, §5.1): request sets, per-request output rates, gains, paired
runs, stock-vs-stock noise, the promotion rule and the sealed final. See ``docs/controller.md``."""
