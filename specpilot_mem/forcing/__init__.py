"""Token forcing (§3.3): a teacher-forced scorer, mismatches and margins, δ calibration, the rate and
event rules, the audit, the verdict and Figure 4. See ``docs/token-forcing.md``."""
