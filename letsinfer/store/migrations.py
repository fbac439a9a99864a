"""Versioned schema migrations, applied in order at open (``PRAGMA user_version``).

Append new steps; never edit a released one.
"""

MIGRATIONS: list[str] = [
    # 1: the foundation
    """
    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        role TEXT NOT NULL CHECK (role IN ('main', 'child')),
        address TEXT,
        state TEXT NOT NULL DEFAULT 'active',
        paused INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX one_main ON nodes(role) WHERE role = 'main';
    CREATE TABLE runtime_releases (
        id TEXT PRIMARY KEY,
        engine TEXT NOT NULL,
        version TEXT NOT NULL,
        target TEXT NOT NULL,
        artifacts TEXT NOT NULL DEFAULT '{}',
        launch TEXT NOT NULL DEFAULT '{}',
        signature TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE model_services (
        name TEXT PRIMARY KEY,
        artifact_digest TEXT NOT NULL,
        artifact_size INTEGER NOT NULL,
        format TEXT NOT NULL,
        source TEXT,
        aliases TEXT NOT NULL DEFAULT '[]',
        created_at REAL NOT NULL
    );
    CREATE TABLE placement_groups (
        id TEXT PRIMARY KEY,
        service TEXT NOT NULL REFERENCES model_services(name) ON DELETE CASCADE,
        node_id TEXT NOT NULL REFERENCES nodes(id),
        release_id TEXT NOT NULL REFERENCES runtime_releases(id),
        target TEXT NOT NULL,
        desired TEXT NOT NULL DEFAULT 'running' CHECK (desired IN ('running', 'stopped')),
        state TEXT NOT NULL DEFAULT 'pending',
        endpoint TEXT,
        pid INTEGER,
        capacity INTEGER,
        restarts INTEGER NOT NULL DEFAULT 0,
        detail TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    -- A GPU belongs to at most one active placement group: the primary key
    -- says so, rows exist only while the group is active.
    CREATE TABLE pg_devices (
        gpu_uuid TEXT PRIMARY KEY,
        pg_id TEXT NOT NULL REFERENCES placement_groups(id) ON DELETE CASCADE,
        node_id TEXT NOT NULL REFERENCES nodes(id)
    );
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        digest TEXT NOT NULL UNIQUE,
        prefix TEXT NOT NULL,
        models TEXT NOT NULL DEFAULT '[]',
        concurrency INTEGER,
        created_at REAL NOT NULL,
        revoked_at REAL
    );
    CREATE UNIQUE INDEX api_key_live_name ON api_keys(name) WHERE revoked_at IS NULL;
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        actor TEXT NOT NULL,
        role TEXT,
        action TEXT NOT NULL,
        target TEXT,
        outcome TEXT NOT NULL,
        detail TEXT,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL
    );
    """,
    # 2: trust: enrollment, controllers, revocation, liveness
    """
    ALTER TABLE nodes ADD COLUMN cert_fingerprint TEXT;
    ALTER TABLE nodes ADD COLUMN last_seen REAL;
    CREATE TABLE enrollments (
        id TEXT PRIMARY KEY,
        candidate_id TEXT NOT NULL,
        name TEXT NOT NULL,
        address TEXT NOT NULL,
        pubkey_sha256 TEXT NOT NULL,
        token_digest TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'accepted', 'refused', 'expired')),
        detail TEXT,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE TABLE controllers (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'administrator')),
        state TEXT NOT NULL CHECK (state IN ('pending', 'paired', 'revoked')),
        code_digest TEXT,
        code_expires_at REAL,
        cert_fingerprint TEXT,
        created_at REAL NOT NULL,
        paired_at REAL,
        revoked_at REAL
    );
    CREATE TABLE revoked_certificates (
        fingerprint TEXT PRIMARY KEY,
        subject TEXT NOT NULL,
        revoked_at REAL NOT NULL
    );
    """,
    # 3: the latest verified facts of each node (targets, GPUs), for placement
    """
    ALTER TABLE nodes ADD COLUMN facts TEXT;
    ALTER TABLE nodes ADD COLUMN facts_at REAL;
    """,
    # 4: parallel placement groups (one task per node) and proven data links
    """
    CREATE TABLE pg_tasks (
        pg_id TEXT NOT NULL REFERENCES placement_groups(id) ON DELETE CASCADE,
        task TEXT NOT NULL,
        node_id TEXT NOT NULL REFERENCES nodes(id),
        address TEXT,
        port INTEGER,
        state TEXT NOT NULL DEFAULT 'pending',
        detail TEXT,
        updated_at REAL NOT NULL,
        PRIMARY KEY (pg_id, task),
        UNIQUE (pg_id, node_id)
    );
    CREATE UNIQUE INDEX pg_task_port ON pg_tasks(node_id, port) WHERE port IS NOT NULL;
    INSERT INTO pg_tasks(pg_id, task, node_id, state, updated_at)
        SELECT id, '0', node_id, state, updated_at FROM placement_groups;
    ALTER TABLE pg_devices ADD COLUMN task TEXT NOT NULL DEFAULT '0';
    ALTER TABLE placement_groups ADD COLUMN paused_reason TEXT;
    CREATE TABLE links (
        node_a TEXT NOT NULL REFERENCES nodes(id),
        node_b TEXT NOT NULL REFERENCES nodes(id),
        state TEXT NOT NULL CHECK (state IN ('proven', 'lost')),
        changed_at REAL NOT NULL,
        PRIMARY KEY (node_a, node_b),
        CHECK (node_a < node_b)
    );
    """,
    # 5: a removed node's row stays for the record, and its name is free again:
    # a wiped host re-enrolls under it (a new id, a new certificate). Unique
    # names only among nodes that are not removed. SQLite cannot drop a column
    # constraint, so the table is rebuilt (migrations run with foreign keys off,
    # then checked). Every column of `nodes` is listed: a migration that adds one
    # before this step must add it here too.
    """
    CREATE TABLE nodes_rebuilt (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('main', 'child')),
        address TEXT,
        state TEXT NOT NULL DEFAULT 'active',
        paused INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        cert_fingerprint TEXT,
        last_seen REAL,
        facts TEXT,
        facts_at REAL,
        removed_at REAL
    );
    INSERT INTO nodes_rebuilt (id, name, role, address, state, paused, created_at,
                               cert_fingerprint, last_seen, facts, facts_at)
        SELECT id, name, role, address, state, paused, created_at,
               cert_fingerprint, last_seen, facts, facts_at FROM nodes;
    DROP TABLE nodes;
    ALTER TABLE nodes_rebuilt RENAME TO nodes;
    CREATE UNIQUE INDEX one_main ON nodes(role) WHERE role = 'main';
    CREATE UNIQUE INDEX node_live_name ON nodes(name) WHERE state != 'removed';
    """,
    # 6: where a pulled model came from (JSON: repo, revision, commit, and each
    # file with the sha256 the hub published); NULL for a model added from a file
    """
    ALTER TABLE model_services ADD COLUMN origin TEXT;
    """,
    # 7: bounded denials (open aggregation windows), counted audit records, the
    # last accepted facts sequence and the witnessed audit head of each node
    """
    ALTER TABLE audit ADD COLUMN count INTEGER;
    CREATE TABLE denial_windows (
        source TEXT NOT NULL,
        action TEXT NOT NULL,
        reason TEXT NOT NULL,
        opened_at REAL NOT NULL,
        held INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (source, action, reason)
    );
    ALTER TABLE nodes ADD COLUMN facts_seq INTEGER;
    ALTER TABLE nodes ADD COLUMN audit_head TEXT;
    ALTER TABLE nodes ADD COLUMN audit_problem TEXT;
    """,
    # 8: lifecycle. A group's generation: raised to make its agent start its
    # engine afresh (unpark, in-place release change, rolling restart); the
    # generation an observation belongs to. What a model's engine must answer to
    # be proven (a completion, or an embedding). Every release each group ran,
    # kept after the group is gone: rollback reinstalls one of these, never
    # "latest".
    """
    ALTER TABLE placement_groups ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE placement_groups ADD COLUMN observed_generation INTEGER;
    ALTER TABLE model_services ADD COLUMN kind TEXT NOT NULL DEFAULT 'completion'
        CHECK (kind IN ('completion', 'embedding'));
    CREATE TABLE release_history (
        seq INTEGER PRIMARY KEY,
        service TEXT NOT NULL,
        node_id TEXT NOT NULL,
        pg_id TEXT NOT NULL,
        release_id TEXT NOT NULL REFERENCES runtime_releases(id),
        event TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX release_history_service ON release_history(service, node_id);
    INSERT INTO release_history(service, node_id, pg_id, release_id, event, at)
        SELECT service, node_id, id, release_id, 'installed', created_at FROM placement_groups;
    """,
    # 9: when the certificate a node last presented with its facts expires
    # (`doctor --cluster`, the certificate-expiry metric)
    """
    ALTER TABLE nodes ADD COLUMN cert_not_after REAL;
    """,
    # 10: the gateway's breadth. Per API key: a priority band, rate limits and
    # a token budget, an opt-in response cache. Per model: an external
    # (OpenAI-compatible) upstream instead of placement groups (JSON: url,
    # provider model, key file, CA file, concurrency; never the key itself), and
    # a fallback model. LoRA adapters, each named in the models' namespace and
    # served by its base model's groups.
    """
    ALTER TABLE api_keys ADD COLUMN band TEXT NOT NULL DEFAULT 'standard'
        CHECK (band IN ('interactive', 'standard', 'batch'));
    ALTER TABLE api_keys ADD COLUMN rpm INTEGER;
    ALTER TABLE api_keys ADD COLUMN tpm INTEGER;
    ALTER TABLE api_keys ADD COLUMN budget_tokens INTEGER;
    ALTER TABLE api_keys ADD COLUMN budget_period TEXT
        CHECK (budget_period IN ('day', 'week', 'month'));
    ALTER TABLE api_keys ADD COLUMN cache_ttl_s INTEGER;
    ALTER TABLE api_keys ADD COLUMN cache_sampled INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE model_services ADD COLUMN external TEXT;
    ALTER TABLE model_services ADD COLUMN fallback TEXT;
    CREATE TABLE model_adapters (
        name TEXT PRIMARY KEY,
        service TEXT NOT NULL REFERENCES model_services(name) ON DELETE CASCADE,
        artifact_digest TEXT NOT NULL,
        artifact_size INTEGER NOT NULL,
        source TEXT,
        created_at REAL NOT NULL
    );
    CREATE INDEX model_adapters_service ON model_adapters(service);
    """,
    # 11: what changed, cheaply, for a main with many nodes. A counter per kind
    # of change, raised by triggers whoever writes (the node, the CLI): the
    # gateway's directory (keys, models, groups' desired state, settings), the
    # groups' observed state, node membership (not facts: those change every
    # report) and revocations. Each node row carries the membership counter of
    # its last change, so a reader asks for the rows changed since it last
    # looked instead of reading every node. Paused nodes have an index of their
    # own (routing asks for them every round).
    """
    CREATE TABLE revisions (name TEXT PRIMARY KEY, rev INTEGER NOT NULL DEFAULT 0);
    INSERT INTO revisions(name) VALUES ('directory'), ('groups'), ('nodes'), ('revoked');
    ALTER TABLE nodes ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX nodes_by_rev ON nodes(rev);
    CREATE INDEX nodes_paused ON nodes(id) WHERE paused = 1;
    CREATE TRIGGER nodes_added AFTER INSERT ON nodes BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'nodes';
        UPDATE nodes SET rev = (SELECT rev FROM revisions WHERE name = 'nodes')
            WHERE id = NEW.id;
    END;
    CREATE TRIGGER nodes_changed AFTER UPDATE ON nodes
    WHEN OLD.name IS NOT NEW.name OR OLD.role IS NOT NEW.role
        OR OLD.address IS NOT NEW.address OR OLD.state IS NOT NEW.state
        OR OLD.paused IS NOT NEW.paused OR OLD.cert_fingerprint IS NOT NEW.cert_fingerprint
        OR OLD.removed_at IS NOT NEW.removed_at
    BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'nodes';
        UPDATE nodes SET rev = (SELECT rev FROM revisions WHERE name = 'nodes')
            WHERE id = NEW.id;
    END;
    CREATE TRIGGER nodes_deleted AFTER DELETE ON nodes BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'nodes';
    END;
    CREATE TRIGGER revoked_added AFTER INSERT ON revoked_certificates BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'revoked';
    END;
    CREATE TRIGGER revoked_deleted AFTER DELETE ON revoked_certificates BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'revoked';
    END;
    CREATE TRIGGER keys_added AFTER INSERT ON api_keys BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER keys_changed AFTER UPDATE ON api_keys BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER keys_deleted AFTER DELETE ON api_keys BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER models_added AFTER INSERT ON model_services BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER models_changed AFTER UPDATE ON model_services BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER models_deleted AFTER DELETE ON model_services BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER settings_added AFTER INSERT ON settings BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER settings_changed AFTER UPDATE ON settings BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER settings_deleted AFTER DELETE ON settings BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER adapters_added AFTER INSERT ON model_adapters BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER adapters_changed AFTER UPDATE ON model_adapters BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER adapters_deleted AFTER DELETE ON model_adapters BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER groups_added AFTER INSERT ON placement_groups BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name IN ('directory', 'groups');
    END;
    CREATE TRIGGER groups_changed AFTER UPDATE ON placement_groups BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'groups'
            OR (name = 'directory'
                AND (OLD.desired IS NOT NEW.desired OR OLD.service IS NOT NEW.service));
    END;
    CREATE TRIGGER groups_deleted AFTER DELETE ON placement_groups BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name IN ('directory', 'groups');
    END;
    CREATE TRIGGER tasks_added AFTER INSERT ON pg_tasks BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'groups';
    END;
    CREATE TRIGGER tasks_deleted AFTER DELETE ON pg_tasks BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'groups';
    END;
    """,
    # 12: a LoRA adapter's own fallback (`model fallback ADAPTER OTHER`).
    """
    ALTER TABLE model_adapters ADD COLUMN fallback TEXT;
    """,
    # 13: the adapters a group was launched with, kept while its model's adapters
    # change until a fresh engine replaces it (letsinfer.lifecycle.adapters).
    """
    CREATE TABLE pg_adapter_pins (
        pg_id TEXT PRIMARY KEY REFERENCES placement_groups(id) ON DELETE CASCADE,
        adapters TEXT NOT NULL
    );
    """,
    # 14: a model's scaling policy (`letsinfer model scale`); none: one group,
    # always loaded. The gateway's directory carries it (on-demand models).
    """
    CREATE TABLE scaling_policies (
        service TEXT PRIMARY KEY REFERENCES model_services(name) ON DELETE CASCADE,
        min_groups INTEGER NOT NULL,
        max_groups INTEGER NOT NULL,
        idle_s REAL NOT NULL,
        min_resident_s REAL NOT NULL,
        target_inflight REAL NOT NULL,
        scale_down_s REAL NOT NULL
    );
    CREATE TRIGGER scaling_added AFTER INSERT ON scaling_policies BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER scaling_changed AFTER UPDATE ON scaling_policies BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER scaling_deleted AFTER DELETE ON scaling_policies BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    """,
    # 15: webhooks (letsinfer.webhooks): the endpoints, and the delivery queue on
    # disk, one row per endpoint and event (an event emitted twice is sent once).
    """
    CREATE TABLE webhooks (
        url TEXT PRIMARY KEY,
        secret TEXT NOT NULL,
        events TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'disabled')),
        disabled_reason TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE webhook_deliveries (
        id TEXT PRIMARY KEY,
        url TEXT NOT NULL REFERENCES webhooks(url) ON DELETE CASCADE,
        event_id TEXT NOT NULL,
        event TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_status TEXT,
        state TEXT NOT NULL
            CHECK (state IN ('pending', 'delivered', 'failed', 'dropped')),
        next_at REAL,
        delivered_at REAL,
        UNIQUE (url, event_id)
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_at);
    """,
    # 16: people (the portal, letsinfer.portal): accounts approved on the CLI,
    # projects whose models and limits bound every key in them, each key's
    # owner and project, and the portal's server-side sessions. An account's
    # state or a project's policy moves the directory (the gateway's keys).
    """
    CREATE TABLE projects (
        name TEXT PRIMARY KEY,
        models TEXT NOT NULL DEFAULT '[]',
        band TEXT CHECK (band IN ('interactive', 'standard', 'batch')),
        rpm INTEGER,
        tpm INTEGER,
        budget_tokens INTEGER,
        budget_period TEXT CHECK (budget_period IN ('day', 'week', 'month')),
        created_at REAL NOT NULL
    );
    CREATE TABLE accounts (
        name TEXT PRIMARY KEY,
        password_hash TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'active', 'suspended')),
        project TEXT REFERENCES projects(name),
        operator INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    );
    CREATE TABLE portal_sessions (
        id_digest TEXT PRIMARY KEY,
        account TEXT NOT NULL REFERENCES accounts(name) ON DELETE CASCADE,
        csrf TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE TABLE sign_in_failures (
        account TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX sign_in_failures_account ON sign_in_failures(account, at);
    ALTER TABLE api_keys ADD COLUMN owner TEXT;
    ALTER TABLE api_keys ADD COLUMN project TEXT;
    CREATE TRIGGER projects_added AFTER INSERT ON projects BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER projects_changed AFTER UPDATE ON projects BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER projects_deleted AFTER DELETE ON projects BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER accounts_changed AFTER UPDATE OF state, project ON accounts BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER accounts_deleted AFTER DELETE ON accounts BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    """,
    # join codes (`letsinfer node add --code`, letsinfer.authority.joining):
    # the public verifier of each code's secret, never the secret.
    """
    CREATE TABLE join_codes (
        id TEXT PRIMARY KEY,
        verifier TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('open', 'used', 'burnt')),
        wrong_proofs INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        used_at REAL,
        node_id TEXT
    );
    """,
    # eval runs (`letsinfer eval`, letsinfer.evals): each run of a suite against
    # a model, its score against its threshold, and each case's score.
    """
    CREATE TABLE eval_runs (
        id TEXT PRIMARY KEY,
        suite TEXT NOT NULL,
        source TEXT NOT NULL,
        model TEXT NOT NULL,
        pg TEXT,
        threshold REAL NOT NULL,
        score REAL NOT NULL,
        passed INTEGER NOT NULL,
        cases INTEGER NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL NOT NULL
    );
    CREATE INDEX eval_runs_started ON eval_runs(started_at);
    CREATE TABLE eval_cases (
        run_id TEXT NOT NULL REFERENCES eval_runs(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        scorer TEXT NOT NULL,
        weight REAL NOT NULL,
        score REAL NOT NULL,
        note TEXT NOT NULL,
        request_id TEXT,
        status INTEGER,
        answer TEXT,
        duration_ms REAL NOT NULL,
        PRIMARY KEY (run_id, idx)
    );
    """,
    # canaries (`model upgrade --canary`, letsinfer.lifecycle.canary): per model
    # at most one new group taking a share of its requests until promoted or
    # aborted; the gateway's directory carries the split (so it moves
    # 'directory'), and it goes with its group or its model.
    """
    CREATE TABLE canaries (
        service TEXT PRIMARY KEY REFERENCES model_services(name) ON DELETE CASCADE,
        pg_id TEXT NOT NULL UNIQUE REFERENCES placement_groups(id) ON DELETE CASCADE,
        percent REAL NOT NULL CHECK (percent > 0 AND percent < 100),
        kind TEXT NOT NULL,
        change TEXT NOT NULL,
        replaces TEXT,
        started_at REAL NOT NULL,
        started_by TEXT NOT NULL
    );
    CREATE TRIGGER canaries_added AFTER INSERT ON canaries BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    CREATE TRIGGER canaries_deleted AFTER DELETE ON canaries BEGIN
        UPDATE revisions SET rev = rev + 1 WHERE name = 'directory';
    END;
    """,
    # weights from their origin (`model update`, letsinfer.lifecycle.weights): a
    # group may run other weights than its model's while an update rolls out
    # (NULL: its model's); every set of weights a model ran is kept with its
    # origin for `model rollback --weights`; a model's gate (`model gate`) is
    # the suite and score its updates and upgrades must reach.
    """
    ALTER TABLE placement_groups ADD COLUMN artifact_digest TEXT;
    CREATE TABLE weight_history (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        service TEXT NOT NULL REFERENCES model_services(name) ON DELETE CASCADE,
        artifact_digest TEXT NOT NULL,
        artifact_size INTEGER NOT NULL,
        origin TEXT,
        event TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX weight_history_service ON weight_history(service);
    CREATE TABLE model_gates (
        service TEXT PRIMARY KEY REFERENCES model_services(name) ON DELETE CASCADE,
        suite TEXT NOT NULL,
        min_score REAL NOT NULL,
        set_at REAL NOT NULL,
        set_by TEXT NOT NULL
    );
    """,
]
