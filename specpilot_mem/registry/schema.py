"""The registry's DuckDB schema. ``SCHEMA_VERSION`` is stored in ``meta``; a file with another
version (or none) is rebuilt from the records, never migrated or trusted.

Every table is derived from a record file: entry tables from ``entries/<id>/entry.yaml``, ``deployments``
from ``rounds/<name>/deployment.yaml``, ``rounds`` and ``promotions`` from a round's ``round.yaml`` and
``promotions.yaml`` (``specpilot_mem.rounds.models``).
``files`` maps every record file to the sha256 of its content, which drives incremental sync.
Tables carry no PRIMARY KEY: sync writes one row per record key by construction, and DuckDB would
load every key index whenever the file is opened for writing, which costs an incremental sync more
than the sync itself. Names are matched through their ``name_key`` (case and punctuation ignored: EAGLE-3 -> eagle3), stored
beside the name so that SQL filters and Python agree.
"""

from __future__ import annotations

SCHEMA_VERSION = 2

TABLES: dict[str, str] = {
    "meta": """
        CREATE TABLE meta (key VARCHAR NOT NULL, value VARCHAR NOT NULL)""",
    "files": """
        CREATE TABLE files (
            path VARCHAR NOT NULL,          -- relative to the memory home, '/'-separated
            kind VARCHAR NOT NULL,          -- entry | deployment | round
            record_key VARCHAR NOT NULL,    -- entry id, deployment name, or deployment/round-n
            sha256 VARCHAR NOT NULL)""",
    "entries": """
        CREATE TABLE entries (
            id VARCHAR NOT NULL,
            title VARCHAR NOT NULL,
            summary VARCHAR NOT NULL,
            contract_level VARCHAR NOT NULL,
            contract_statement VARCHAR NOT NULL,
            contract_commands VARCHAR[] NOT NULL,
            limits VARCHAR[] NOT NULL,
            reproduces VARCHAR NOT NULL,
            source_round VARCHAR,
            source_commit VARCHAR,
            kernels JSON NOT NULL,
            validated BOOLEAN NOT NULL,     -- non-synthetic paired-run evidence and no rejecting verdict
            status VARCHAR NOT NULL,        -- verified | candidate | superseded, on scope_sglang
            scope_sglang VARCHAR,           -- the SGLang release the status is about
            scope JSON NOT NULL,            -- the record's scope: sglang, arch, target, drafter, regime
            search_text VARCHAR NOT NULL,   -- lower-cased title, summary and limits, for --text
            card JSON NOT NULL,             -- what `query` shows of the entry, prepared at sync time
            record JSON NOT NULL)           -- the whole record (model_dump): readers skip parsing YAML""",
    "requirements": """
        CREATE TABLE requirements (
            entry_id VARCHAR NOT NULL,
            requires_id VARCHAR NOT NULL,
            position INTEGER NOT NULL)""",
    "releases": """
        CREATE TABLE releases (
            entry_id VARCHAR NOT NULL,
            release VARCHAR NOT NULL,       -- another SGLang release the entry was checked on (revalidate, port)
            status VARCHAR NOT NULL,        -- its status there
            verdict VARCHAR NOT NULL,       -- clean | drift | conflict | superseded | blocked
            ported BOOLEAN NOT NULL,        -- a ported delta exists for the release
            base VARCHAR NOT NULL,          -- the release's commit in the fork
            checked DATE NOT NULL,
            changed VARCHAR[] NOT NULL,     -- files it touches that changed upstream
            conflicts VARCHAR[] NOT NULL)""",
    "options": """
        CREATE TABLE options (
            entry_id VARCHAR NOT NULL,
            name VARCHAR NOT NULL,
            type VARCHAR NOT NULL,
            default_value JSON,
            help VARCHAR NOT NULL,
            choices JSON)""",
    "variants": """
        CREATE TABLE variants (
            entry_id VARCHAR NOT NULL,
            name VARCHAR NOT NULL,
            options JSON NOT NULL,
            hardware VARCHAR[] NOT NULL,    -- arch ids
            notes VARCHAR NOT NULL)""",
    "evidence": """
        CREATE TABLE evidence (
            entry_id VARCHAR NOT NULL,
            idx INTEGER NOT NULL,           -- position in the record's evidence list
            kind VARCHAR NOT NULL,
            gpu VARCHAR NOT NULL,           -- as written in the record
            gpu_name VARCHAR,               -- canonical name from the GPU table; NULL for a GPU it does not know
            arch VARCHAR NOT NULL,
            target VARCHAR,
            drafter VARCHAR,
            target_key VARCHAR,             -- name_key(target): lower-case letters and digits only
            drafter_key VARCHAR,
            drafter_family VARCHAR,         -- leading letters of the drafter: DFlash2 -> dflash
            regime VARCHAR,
            batch_sizes INTEGER[] NOT NULL,
            verdict VARCHAR,
            command VARCHAR NOT NULL,
            date DATE NOT NULL,
            round VARCHAR,
            results VARCHAR,
            synthetic BOOLEAN NOT NULL)""",
    "figures": """
        CREATE TABLE figures (
            entry_id VARCHAR NOT NULL,
            evidence_idx INTEGER NOT NULL,
            position INTEGER NOT NULL,      -- position in the evidence's figures list; 0 is its headline
            name VARCHAR NOT NULL,
            value DOUBLE NOT NULL,
            unit VARCHAR NOT NULL,
            ci_low DOUBLE,
            ci_high DOUBLE)""",
    "untested": """
        CREATE TABLE untested (
            entry_id VARCHAR NOT NULL,
            note VARCHAR NOT NULL,
            regime VARCHAR,
            arch VARCHAR,
            gpu VARCHAR,
            drafter VARCHAR,
            model VARCHAR)""",
    "deployments": """
        CREATE TABLE deployments (
            name VARCHAR NOT NULL,
            gpu VARCHAR NOT NULL,
            arch VARCHAR NOT NULL,
            model VARCHAR NOT NULL,
            drafter VARCHAR NOT NULL,
            regime VARCHAR NOT NULL,
            batch_sizes INTEGER[] NOT NULL,
            entries VARCHAR[] NOT NULL,
            suggested JSON NOT NULL,
            base VARCHAR NOT NULL,
            branch VARCHAR NOT NULL,
            tree VARCHAR NOT NULL,
            created DATE NOT NULL)""",
    "rounds": """
        CREATE TABLE rounds (
            deployment VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            path VARCHAR NOT NULL,          -- rounds/<deployment>/round-<n>
            start VARCHAR NOT NULL,         -- the system commit the round started from
            lineage VARCHAR NOT NULL,       -- branch holding its promotions as --no-ff merges
            best VARCHAR NOT NULL,
            stock VARCHAR NOT NULL,
            phases_done VARCHAR[] NOT NULL,
            started TIMESTAMPTZ NOT NULL,
            finished TIMESTAMPTZ,
            sealed JSON,                    -- the sealed final's verdict, once run
            distilled VARCHAR[] NOT NULL)   -- entry ids recorded from the round""",
    "promotions": """
        CREATE TABLE promotions (
            deployment VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            "order" INTEGER NOT NULL,
            direction VARCHAR NOT NULL,
            phase VARCHAR NOT NULL,
            candidate VARCHAR NOT NULL,
            merge VARCHAR NOT NULL,
            previous_best VARCHAR NOT NULL,
            gain DOUBLE NOT NULL,
            ci_low DOUBLE NOT NULL,
            ci_high DOUBLE NOT NULL,
            noise DOUBLE NOT NULL,
            threshold DOUBLE NOT NULL,
            token_forcing VARCHAR NOT NULL,
            requests INTEGER NOT NULL,
            devices VARCHAR[] NOT NULL,
            rate DOUBLE)""",
}

# Rows of these tables belong to one entry (column entry_id) and are replaced together when its record changes.
ENTRY_TABLES = ("requirements", "releases", "options", "variants", "evidence", "figures", "untested")
